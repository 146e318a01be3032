"""The library of known forward-pass variants that search composes into candidates.

- `MOVES`: one `Move` per option of the template candidate (the pieces under `templates/fast/`), with
  its allowed values, its baseline value and what it does.
- `render(template, options) -> str`: a candidate source, one file composed from the template's pieces,
  with those options; `read_options` parses them back. The variant search samples `search_space(moe)`
  and renders.
- `best_candidate(spec, device)`: the hand-picked best-known render for dense or MoE models.
"""

from athanor.moves.best import best_candidate, best_options
from athanor.moves.catalog import MOVES, MOVES_BY_NAME, Move, baseline_options, search_space
from athanor.moves.render import TEMPLATES, parse_settings, read_options, render, template_source, validate

__all__ = [
    "MOVES",
    "MOVES_BY_NAME",
    "TEMPLATES",
    "Move",
    "baseline_options",
    "best_candidate",
    "best_options",
    "parse_settings",
    "read_options",
    "render",
    "search_space",
    "template_source",
    "validate",
]
