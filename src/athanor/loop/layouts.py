"""The parallel layouts a compile session confirms beside one device, from an `athanor plan`.

A candidate declares the layout it runs in (`LAYOUT = "tp2"`, `athanor.seams`); the evaluator runs it in a worker
group of that layout and counts its steps in device-seconds, the objective's unit. So a layout competes like any
candidate: after the search, the session's best forward (its winner, else its baseline) is confirmed on the slow
tier in each of the plan's top layouts, and the reference forward in that layout where the best one cannot run in
it (a forward written for one device). The winner is the cheapest in device-seconds, and its file records its layout.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from athanor.engine.candidate import Candidate
from athanor.engine.config import EngineConfig, parse_layout
from athanor.errors import ConfigError
from athanor.seams import layout_name, with_layout


def plan_layouts(path: str | Path, model: str, concurrency: int, top: int) -> tuple[str, ...]:
    """The `top` cheapest layouts that fit at the level of the plan in `path` (`athanor plan --json`) nearest
    `concurrency`, that one engine runs (TP, EP, DCP: DP replicas and PP stages are not built into one), other than
    one device (what every candidate runs on already)."""
    from athanor.model.registry import load_spec

    flag = f"--plan {path}"
    try:
        plan: Any = json.loads(Path(path).read_text())
    except OSError as e:
        raise ConfigError(f"{flag}: cannot read it ({e.strerror}); write one with athanor plan ... --json FILE") from None
    except json.JSONDecodeError as e:
        raise ConfigError(f"{flag}: not JSON ({e.msg} at line {e.lineno}); write one with athanor plan --json") from None
    levels = plan.get("levels") if isinstance(plan, dict) else None
    if not isinstance(levels, dict) or not levels or not all(str(c).isdigit() for c in levels):
        raise ConfigError(f"{flag}: no 'levels' of layouts by concurrency; write one with athanor plan --json")
    name = load_spec(model).name
    if plan.get("model") != name:
        raise ConfigError(f"{flag}: plans {plan.get('model')!r}, not this compile's {name}; plan --model {model}")
    level = min((int(c) for c in levels), key=lambda c: (abs(c - concurrency), c))
    chosen: list[str] = []
    for row in levels[str(level)]:
        degrees = parse_layout(str(row.get("layout", "")), f"{flag}: layout")
        if row.get("fits") and degrees and degrees.get("dp", 1) == 1 and degrees.get("pp", 1) == 1:
            chosen.append(layout_name(degrees))
    return tuple(dict.fromkeys(chosen))[:top]


def check_layouts(model: str, layouts: tuple[str, ...], device: str) -> None:
    """A one-line error, before anything starts, for a layout no engine here can run."""
    from athanor.engine.group import check_layout

    for name in layouts:
        check_layout(EngineConfig(model=model, device=device, layout=parse_layout(name, "--layout")))


def in_layout(cand: Candidate, layout: str) -> Candidate:
    """`cand` declaring `layout`: a contender of its own (another source, so another id)."""
    m = cand.manifest
    return Candidate.from_source(with_layout(cand.source, parse_layout(layout)), parent=cand.id,
                                 author=m.author or "plan", description=f"{m.description or cand.id} in layout {layout}")
