"""The dashboard's figures: each is data first (`Bars`, `Points`), drawn as inline SVG for the pages (no script, no
asset from the network) or as a PNG file through matplotlib (`athanor dashboard --png`, the plot extra).

Every text placed in an SVG is escaped here, since the SVG is inserted into the page as markup.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from html import escape
from pathlib import Path

from markupsafe import Markup

from athanor.dashboard.views import CandidateView, RunView, TrafficView
from athanor.errors import ConfigError

WIDTH, HEIGHT = 640, 240
LEFT, RIGHT, TOP, BOTTOM = 56, 12, 24, 56


@dataclass(frozen=True)
class Bars:
    title: str
    labels: list[str]
    values: list[float]
    y_label: str
    reference: float | None = None
    """A horizontal line (1.0 for shares of a ceiling)."""


@dataclass(frozen=True)
class Points:
    title: str
    x: list[float]
    y: list[float]
    low: list[float]
    high: list[float]
    marked: list[bool]
    """Drawn filled (a verdict that was accepted, a window that warranted a recompile)."""
    x_label: str
    y_label: str
    reference: float | None = None


Chart = Bars | Points


def speedup_chart(view: RunView) -> Points:
    p = view.points
    return Points("speedup of each verdict over the run (filled: accepted)", [q.minutes for q in p],
                  [q.median for q in p], [q.ci_low for q in p], [q.ci_high for q in p], [q.accepted for q in p],
                  "minutes since the run started", "speedup", 1.0)


def agents_chart(view: RunView) -> Bars:
    return Bars("each agent's share of the evaluation time", [a.name for a in view.agents],
                [a.share for a in view.agents], "share")


def roofline_chart(view: CandidateView) -> Bars:
    rows = [s for s in view.shapes if s.roofline_share is not None]
    return Bars("roofline share per shape (the step's floor over its time)", [s.label for s in rows],
                [s.roofline_share or 0.0 for s in rows], "share of the roofline", 1.0)


def length_chart(view: TrafficView, side: str) -> Bars | None:
    """The latest profile's `side` ("input" or "output") length histogram, over its power-of-two buckets."""
    if view.latest is None:
        return None
    profile = view.latest.profile
    hist = list((profile.get(side) or {}).get("hist") or ())
    edges = list(profile.get("hist_edges") or ())
    if not hist or len(edges) < len(hist):
        return None
    last = max((i for i, h in enumerate(hist) if h), default=0)
    first = min((i for i, h in enumerate(hist) if h), default=0)
    labels = [f"{edges[i]:,}" for i in range(first, last + 1)]
    return Bars(f"{side} tokens per request ({view.latest.source})", labels,
                [float(h) for h in hist[first:last + 1]], "requests")


def drift_chart(view: TrafficView) -> Points:
    rows = view.timeline
    return Points("mean input tokens per snapshot (filled: a recompile followed)", list(range(1, len(rows) + 1)),
                  [r.mean_input for r in rows], [r.mean_input for r in rows], [r.mean_input for r in rows],
                  [bool(r.recompile) for r in rows], "snapshot", "mean input tokens")


# -- SVG ---------------------------------------------------------------------------------------------------------
def _scale(lo: float, hi: float, a: float, b: float) -> tuple[float, float]:
    """(slope, offset) mapping [lo, hi] onto [a, b]."""
    span = (hi - lo) or 1.0
    return (b - a) / span, a - lo * (b - a) / span


def _frame(title: str, y_label: str, y_lo: float, y_hi: float) -> list[str]:
    m, c = _scale(y_lo, y_hi, HEIGHT - BOTTOM, TOP)
    out = [f'<text x="{LEFT}" y="14" class="title">{escape(title)}</text>',
           f'<line x1="{LEFT}" y1="{TOP}" x2="{LEFT}" y2="{HEIGHT - BOTTOM}" class="axis"/>',
           f'<line x1="{LEFT}" y1="{HEIGHT - BOTTOM}" x2="{WIDTH - RIGHT}" y2="{HEIGHT - BOTTOM}" class="axis"/>',
           f'<text x="12" y="{(TOP + HEIGHT - BOTTOM) / 2:.0f}" class="label" '
           f'transform="rotate(-90 12 {(TOP + HEIGHT - BOTTOM) / 2:.0f})">{escape(y_label)}</text>']
    for k in range(5):
        v = y_lo + (y_hi - y_lo) * k / 4
        y = m * v + c
        out.append(f'<text x="{LEFT - 4}" y="{y + 3:.1f}" class="tick" text-anchor="end">{_fmt(v)}</text>')
    return out


def _fmt(v: float) -> str:
    return f"{v:,.0f}" if abs(v) >= 100 else f"{v:.3g}"


def _reference(value: float | None, y_lo: float, y_hi: float) -> list[str]:
    if value is None or not y_lo <= value <= y_hi:
        return []
    m, c = _scale(y_lo, y_hi, HEIGHT - BOTTOM, TOP)
    y = m * value + c
    return [f'<line x1="{LEFT}" y1="{y:.1f}" x2="{WIDTH - RIGHT}" y2="{y:.1f}" class="reference"/>']


def _bars_svg(chart: Bars) -> list[str]:
    hi = max([*chart.values, chart.reference or 0.0, 1e-9])
    out = _frame(chart.title, chart.y_label, 0.0, hi) + _reference(chart.reference, 0.0, hi)
    m, c = _scale(0.0, hi, HEIGHT - BOTTOM, TOP)
    n = max(len(chart.values), 1)
    step = (WIDTH - LEFT - RIGHT) / n
    for i, (label, value) in enumerate(zip(chart.labels, chart.values, strict=True)):
        x, y = LEFT + i * step + step * 0.1, m * value + c
        out.append(f'<rect x="{x:.1f}" y="{y:.1f}" width="{step * 0.8:.1f}" height="{HEIGHT - BOTTOM - y:.1f}" '
                   f'class="bar"><title>{escape(label)}: {_fmt(value)}</title></rect>')
        short = label if len(label) <= 14 else label[:13] + "\u2026"
        cx = x + step * 0.4
        out.append(f'<text x="{cx:.1f}" y="{HEIGHT - BOTTOM + 12}" class="tick" text-anchor="end" '
                   f'transform="rotate(-30 {cx:.1f} {HEIGHT - BOTTOM + 12})">{escape(short)}</text>')
    return out


def _points_svg(chart: Points) -> list[str]:
    finite = [v for v in (*chart.y, *chart.low, *chart.high) if v == v and not math.isinf(v)]
    if chart.reference is not None:
        finite.append(chart.reference)
    lo, hi = (min(finite), max(finite)) if finite else (0.0, 1.0)
    pad = (hi - lo) * 0.05 or 0.05
    lo, hi = lo - pad, hi + pad
    out = _frame(chart.title, chart.y_label, lo, hi) + _reference(chart.reference, lo, hi)
    out.append(f'<text x="{(LEFT + WIDTH - RIGHT) / 2:.0f}" y="{HEIGHT - 8}" class="label" '
               f'text-anchor="middle">{escape(chart.x_label)}</text>')
    if not chart.x:
        return out
    mx, cx = _scale(min(chart.x), max(chart.x), LEFT + 8, WIDTH - RIGHT - 8)
    my, cy = _scale(lo, hi, HEIGHT - BOTTOM, TOP)
    for k in range(5):
        v = min(chart.x) + (max(chart.x) - min(chart.x)) * k / 4
        out.append(f'<text x="{mx * v + cx:.1f}" y="{HEIGHT - BOTTOM + 14}" class="tick" '
                   f'text-anchor="middle">{_fmt(v)}</text>')
    for x, y, a, b, marked in zip(chart.x, chart.y, chart.low, chart.high, chart.marked, strict=True):
        if y != y:
            continue
        px = mx * x + cx
        if a == a and b == b and a != b:
            out.append(f'<line x1="{px:.1f}" y1="{my * a + cy:.1f}" x2="{px:.1f}" y2="{my * b + cy:.1f}" '
                       'class="whisker"/>')
        out.append(f'<circle cx="{px:.1f}" cy="{my * y + cy:.1f}" r="4" class="{"marked" if marked else "point"}">'
                   f'<title>{_fmt(y)}</title></circle>')
    return out


def svg(chart: Chart | None) -> Markup:
    """The chart as an inline SVG element (empty for no chart)."""
    if chart is None:
        return Markup("")
    body = _bars_svg(chart) if isinstance(chart, Bars) else _points_svg(chart)
    return Markup(f'<svg class="chart" viewBox="0 0 {WIDTH} {HEIGHT}" role="img" '
                  f'aria-label="{escape(chart.title)}">' + "".join(body) + "</svg>")


# -- PNG ---------------------------------------------------------------------------------------------------------
def write_png(chart: Chart, path: Path) -> Path:
    """The chart as a PNG file (matplotlib, the plot extra)."""
    try:
        import matplotlib
    except ModuleNotFoundError:
        raise ConfigError("athanor dashboard --png needs the plot extra: pip install 'athanor[plot]'") from None
    matplotlib.use("Agg")  # no display on servers
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 3.2))
    if isinstance(chart, Bars):
        ax.bar(range(len(chart.values)), chart.values, color="tab:blue")
        ax.set_xticks(range(len(chart.labels)), chart.labels, rotation=30, ha="right", fontsize=7)
    else:
        err = [[y - a for y, a in zip(chart.y, chart.low, strict=True)],
               [b - y for y, b in zip(chart.y, chart.high, strict=True)]]
        ax.errorbar(chart.x, chart.y, yerr=err, fmt="none", ecolor="0.6")
        ax.scatter(chart.x, chart.y, c=["tab:green" if m else "tab:blue" for m in chart.marked], zorder=3)
        ax.set_xlabel(chart.x_label)
    if chart.reference is not None:
        ax.axhline(chart.reference, color="0.5", linestyle="--", linewidth=1)
    ax.set_ylabel(chart.y_label)
    ax.set_title(chart.title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path

