"""Parsing and applying a model's reply: SEARCH/REPLACE blocks (exact, whitespace- and
indentation-tolerant), whole files, and the errors that go back to the model."""

from __future__ import annotations

import pytest
from toy_candidate import INCUMBENT

from athanor.agents.editing import EditError, apply_edit, parse_reply


def _block(search: str, replace: str) -> str:
    return f"<<<<<<< SEARCH\n{search}\n=======\n{replace}\n>>>>>>> REPLACE\n"


def test_exact_block_applies() -> None:
    edit = parse_reply("DESCRIPTION: bigger\n" + _block("def build(model, ctx):", "def build(model, ctx):  # new"))
    assert edit.description == "bigger" and len(edit.blocks) == 1
    assert "def build(model, ctx):  # new" in apply_edit(INCUMBENT, edit)


def test_trailing_whitespace_and_crlf_are_tolerated() -> None:
    reply = _block("    def __init__(self, model):   \n        self.model = model  ", "    def __init__(self, model):\n"
                   "        self.model = model\n        self.ready = True").replace("\n", "\r\n")
    assert "self.ready = True" in apply_edit(INCUMBENT, parse_reply(reply))


def test_lost_indentation_is_restored() -> None:
    # The model quoted a method body without its indentation.
    reply = _block("q = layer.q_proj(hidden)\nk = layer.k_proj(hidden)", "q = layer.q_proj(hidden) * 1\nk = layer.k_proj(hidden)")
    new = apply_edit(INCUMBENT, parse_reply(reply))
    assert "            q = layer.q_proj(hidden) * 1\n            k = layer.k_proj(hidden)\n" in new


def test_full_file_reply() -> None:
    reply = "Here you go.\n```python\n" + INCUMBENT.replace("graph_safe = True", "graph_safe = False") + "```\n"
    edit = parse_reply(reply)
    assert edit.full_source is not None and edit.description == "Here you go."
    assert "graph_safe = False" in apply_edit(INCUMBENT, edit)


@pytest.mark.parametrize(("reply", "message"), [
    ("I think fusing is good.", "neither SEARCH/REPLACE blocks nor"),
    ("```python\nx = 1\n```", "neither SEARCH/REPLACE blocks nor"),
    ("<<<<<<< SEARCH\nimport torch\n=======\nimport torch as t\n", "not closed"),
    ("<<<<<<< SEARCH\nimport torch\n>>>>>>> REPLACE\n", "no '=======' line"),
])
def test_unparseable_replies(reply: str, message: str) -> None:
    with pytest.raises(EditError, match=message):
        parse_reply(reply)


@pytest.mark.parametrize(("reply", "message"), [
    (_block("hidden = self.norm(hidden)", "x"), "does not match the source"),
    (_block("        hidden = hiden + layer.attend(q, k, v)", "x"), "resembles line"),
    (_block("class Forward:", "class Forward:"), "unchanged"),
    (_block("import torch", "import torch\ndef broken(:"), "does not parse: line"),
    (_block("", "x = 1"), "empty"),
])
def test_errors_that_go_back_to_the_model(reply: str, message: str) -> None:
    with pytest.raises(EditError, match=message):
        apply_edit(INCUMBENT, parse_reply(reply))


def test_ambiguous_search_is_refused() -> None:
    source = INCUMBENT + "\nx = 1\nx = 1\n"
    with pytest.raises(EditError, match="matches 2 places"):
        apply_edit(source, parse_reply(_block("x = 1", "x = 2")))
