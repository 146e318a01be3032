"""Rendering a template candidate with chosen options, and reading the options back.

A template is a complete candidate file whose behaviour is selected by one dict literal between
the markers `# --- OPTIONS` and `# --- end OPTIONS ---`. `render` replaces that block with the
chosen values (validated against the `Move`s) and nothing else, so the result is an ordinary
candidate source that agents may keep editing and `read_options` can parse again.
"""

from __future__ import annotations

import ast
from importlib import resources
from typing import Any

from athanor.errors import ConfigError
from athanor.moves.catalog import MOVES_BY_NAME, baseline_options

BEGIN = "# --- OPTIONS"
END = "# --- end OPTIONS ---"
TEMPLATES = ("fast",)
"""Template names under athanor/moves/templates/ (one template covers dense and MoE models)."""


def template_source(name: str = "fast") -> str:
    """The source text of template `name`."""
    if name not in TEMPLATES:
        raise ConfigError(f"unknown template {name!r}: use one of {', '.join(TEMPLATES)}")
    return resources.files("athanor.moves.templates").joinpath(f"{name}.py").read_text()


def _block(source: str) -> tuple[int, int]:
    begin = source.find(BEGIN)
    end = source.find(END, begin)
    if begin < 0 or end < 0:
        raise ConfigError(f"the source has no OPTIONS block between {BEGIN!r} and {END!r}: is it a template?")
    return begin, end + len(END)


def read_options(source: str) -> dict[str, Any]:
    """The OPTIONS dict of a template or rendered candidate source."""
    begin, end = _block(source)
    body = source[begin:end]
    try:
        tree = ast.parse(body)
        assign = next(n for n in tree.body if isinstance(n, ast.Assign | ast.AnnAssign))
        value = ast.literal_eval(assign.value)  # type: ignore[arg-type]
    except (SyntaxError, StopIteration, ValueError) as e:
        raise ConfigError(f"the OPTIONS block is not a literal dict: {e}") from None
    if not isinstance(value, dict):
        raise ConfigError("OPTIONS must be a dict literal")
    return value


def parse_settings(items: list[str]) -> dict[str, Any]:
    """OPTION=VALUE texts (a command line's) as options: VALUE a Python literal (True, 1, None), else a string."""
    out: dict[str, Any] = {}
    for item in items:
        name, sep, text = item.partition("=")
        if not sep:
            raise ConfigError(f"{item!r} is not OPTION=VALUE")
        try:
            out[name] = ast.literal_eval(text)
        except (ValueError, SyntaxError):
            out[name] = text
    return out


def validate(options: dict[str, Any]) -> dict[str, Any]:
    """`options` over the baseline, after checking every name and value against its Move."""
    for name, value in options.items():
        move = MOVES_BY_NAME.get(name)
        if move is None:
            raise ConfigError(f"unknown option {name!r}: known options are {', '.join(sorted(MOVES_BY_NAME))}")
        if value not in move.values or type(value) is not type(move.values[move.values.index(value)]):
            raise ConfigError(f"option {name}={value!r} is not allowed: use one of "
                              f"{', '.join(repr(v) for v in move.values)}")
    return {**baseline_options(), **options}


def render(template: str, options: dict[str, Any]) -> str:
    """Candidate source: template `template` (a name or a template's source) with `options` substituted.

    Options not given keep their baseline value. Unknown names or disallowed values raise ConfigError.
    """
    source = template_source(template) if "\n" not in template else template
    full = validate(options)
    begin, end = _block(source)
    lines = [f"{BEGIN} (rendered by athanor.moves.render) ---", "OPTIONS: dict[str, Any] = {"]
    lines += [f"    {name!r}: {value!r}," for name, value in full.items()]
    lines += ["}", END]
    return source[:begin] + "\n".join(lines).replace("'", '"') + source[end:]
