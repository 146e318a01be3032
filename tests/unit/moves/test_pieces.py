"""The template's pieces: small real modules, composed by `render` into one candidate file. That the file computes,
option set by option set, bit for bit what the template computed as one file is the slow tier's
(tests/slow/moves/test_pieces_equivalence.py)."""

from __future__ import annotations

import ast
import importlib
import importlib.util
import sys
from pathlib import Path

import torch

from athanor.model import BuildContext, DecodeBatch, make_prefill_batch
from athanor.model.presets import PRESETS
from athanor.model.random_init import random_model
from athanor.moves import template_source
from athanor.moves.templates import fast


def _top_level_names(source: str) -> list[str]:
    names = []
    for node in ast.parse(source).body:
        if isinstance(node, ast.FunctionDef | ast.ClassDef):
            names.append(node.name)
        elif isinstance(node, ast.Assign):
            names += [t.id for t in node.targets if isinstance(t, ast.Name)]
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.append(node.target.id)
    return names


def test_every_piece_is_a_small_module_of_its_own():
    folder = Path(fast.__file__).parent
    assert {p.stem for p in folder.glob("*.py")} == {"__init__", *fast.PIECES}  # no file left out of the render
    for piece in fast.PIECES:
        module = importlib.import_module(f"athanor.moves.templates.fast.{piece}")
        lines = len(Path(module.__file__).read_text().splitlines())
        assert lines <= 250, f"{piece}.py has {lines} lines: a piece is one idea, under 250 lines"


def test_the_candidate_is_one_file_defining_each_pieces_names_once():
    source = template_source("fast")
    tree = ast.parse(source)
    imported = [n.module or "" for n in tree.body if isinstance(n, ast.ImportFrom)]
    imported += [a.name for n in tree.body if isinstance(n, ast.Import) for a in n.names]
    assert not [m for m in imported if m.startswith("athanor.moves")]  # the pieces' imports of one another are gone
    folder = Path(fast.__file__).parent
    pieces = [name for piece in fast.PIECES for name in _top_level_names((folder / f"{piece}.py").read_text())]
    assert len(pieces) == len(set(pieces)), "two pieces define the same name: the rendered file would keep one"
    assert _top_level_names(source) == pieces
    assert ast.get_docstring(tree) == fast.__doc__.strip()
    assert source.count("\nOPTIONS: dict[str, Any] = {\n") == 1


def test_the_pieces_run_as_modules(tmp_path):
    """What ruff, mypy and a reader see is what runs: the pieces imported as modules (at the baseline options)
    compute the rendered candidate's outputs, bit for bit."""
    from athanor.moves.templates.fast import forward

    path = tmp_path / "candidate_pieces.py"
    path.write_text(template_source("fast"))
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None and spec.loader is not None
    rendered = importlib.util.module_from_spec(spec)
    sys.modules[path.stem] = rendered
    spec.loader.exec_module(rendered)
    model = random_model(PRESETS["tiny-moe"].with_layers(2), seed=0)
    outputs = []
    for build in (forward.build, rendered.build):
        fwd = build(model, BuildContext(torch.device("cpu"), torch.float32, max_seqs=4, max_seq_len=64))
        routes: list[torch.Tensor] = []
        fwd.routing_observer = lambda i, ids, routes=routes: routes.append(ids)
        with torch.no_grad():
            outs = [fwd.prefill(make_prefill_batch([[1, 2, 3, 4, 5], [6, 7]], [0, 2]))]
            pos = torch.tensor([5, 2])
            outs.append(fwd.decode(DecodeBatch(torch.tensor([8, 9]), pos, torch.tensor([0, 2]), pos)))
        outputs.append(outs + routes)
    assert len(outputs[0]) == len(outputs[1]) > 2 and all(torch.equal(a, b) for a, b in zip(*outputs))
