"""Prompt files and the rendering of an `AgentContext` into the text an LLM or CLI agent reads.

Prompts are files under `prompts/` (or any path the user gives), filled with `string.Template`
(`$name`), whose syntax does not clash with the braces of the Python source they carry.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Sequence
from pathlib import Path
from string import Template

from athanor.agents.base import AgentContext
from athanor.errors import ConfigError
from athanor.store import EvaluationRecord, LeaderboardEntry, Post

PROMPTS_DIR = Path(__file__).parent / "prompts"
PROMPT_STYLES = ("naive", "expert")

_FIGURES_CHARS = 1500
"""How much of a verdict's figures (JSON) goes into a prompt: enough for the error and key numbers."""


def load_prompt(name: str, *, flag: str = "prompt") -> str:
    """A prompt by style name (`naive`, `expert`, or a file under prompts/) or by path."""
    path = PROMPTS_DIR / f"{name}.md"
    if not path.is_file():
        path = Path(name).expanduser()
    if not path.is_file():
        raise ConfigError(f"{flag}: no prompt {name!r}; use one of {', '.join(PROMPT_STYLES)} or a file path")
    return path.read_text()


def fill(template: str, **values: str) -> str:
    """`template` with `$name` placeholders filled; unknown placeholders stay as they are."""
    return Template(template).safe_substitute(values)


def _speedup(low: float, mid: float, high: float) -> str:
    if math.isnan(mid):
        return "n/a"
    return f"{mid:.3f}x [{low:.3f}, {high:.3f}]"


def render_leaderboard(entries: Sequence[LeaderboardEntry]) -> str:
    if not entries:
        return "(no accepted candidate yet)"
    return "\n".join(
        f"{e.rank}. {e.candidate_id} by {e.author}: speedup {_speedup(e.speedup_ci_low, e.speedup, e.speedup_ci_high)}, "
        f"{e.gpu_s_per_1k:.4g} GPU-s/1k requests ({e.tier} tier) — {e.description}" for e in entries)


def render_verdict(v: EvaluationRecord, *, with_figures: bool = False) -> str:
    line = (f"{v.candidate_id} by {v.author or '?'}: {v.status} at stage {v.stage} ({v.tier} tier, {v.wall_s:.1f}s)"
            f" — {v.reason or 'no reason given'}; speedup {_speedup(v.speedup_ci_low, v.speedup, v.speedup_ci_high)}")
    if with_figures and v.figures:
        figures = json.dumps(v.figures, sort_keys=True, default=str)
        if len(figures) > _FIGURES_CHARS:
            figures = figures[:_FIGURES_CHARS] + " ...(truncated)"
        line += f"\n  figures: {figures}"
    return line


def render_verdicts(verdicts: Iterable[EvaluationRecord]) -> str:
    lines = [render_verdict(v) for v in verdicts]
    return "\n".join(lines) if lines else "(none yet)"


def render_posts(posts: Iterable[Post]) -> str:
    lines = [f"[{p.kind}] {p.agent}{f' on {p.candidate_id}' if p.candidate_id else ''}: {p.text}" for p in posts]
    return "\n".join(lines) if lines else "(no posts yet)"


def context_sections(context: AgentContext, feedback: Sequence[str]) -> dict[str, str]:
    """The `$name` values of task.md and cli_readme.md for `context`."""
    return dict(
        model_summary=context.model_summary or "(not given)",
        traffic_summary=context.traffic_summary or "(not given)",
        profile=context.profile or "(no profile available)",
        leaderboard=render_leaderboard(context.leaderboard),
        recent_verdicts=render_verdicts(context.recent_verdicts),
        posts=render_posts(context.posts),
        feedback="\n\n".join(feedback) if feedback else "(this is your first attempt)",
        incumbent_id=context.incumbent_id,
        source=context.incumbent_source.rstrip("\n"),
    )
