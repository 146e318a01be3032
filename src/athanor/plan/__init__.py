"""`athanor plan`: rank the parallel layouts of a model on N GPUs for a traffic profile.

For each concurrency level (sequences in flight across the whole deployment) every feasible layout
(`cost.layouts`) is priced: GPU-seconds per 1,000 requests of the traffic (the project's objective: each request's
prefill plus its share of the decode steps, times the GPUs a replica takes), time per output token and time to
first token at that concurrency, and whether each GPU holds its weights and its sequences' KV. The ranking is per
level, since the best layout moves with concurrency.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from athanor.errors import ConfigError
from athanor.model import Layout, ModelSpec
from athanor.plan.calibration import Calibration
from athanor.plan.cost import DecodeFit, decode_step, held_bytes, layouts, prefill_s
from athanor.plan.hardware import Hardware
from athanor.traffic import TrafficProfile

if TYPE_CHECKING:
    from athanor.traffic.routing import RoutingProfile

DEFAULT_CONCURRENCY = (1, 8, 32, 64, 128, 256)


@dataclass(frozen=True)
class Estimate:
    layout: Layout
    concurrency: int
    rows: int
    """Sequences one replica decodes at once."""
    fits: bool
    gib_per_gpu: float
    gpu_s_per_1k: float
    tpot_s: float
    ttft_s: float
    comm_share: float
    """Of a decode step, the share spent in collectives."""


@dataclass(frozen=True)
class Plan:
    model: str
    hardware: Hardware
    gpus: int
    traffic: str
    input_mean: float
    output_mean: float
    calibration: Calibration
    routing: str = ""
    """The MoE routing profile's source ("": uniform routing)."""
    levels: dict[int, list[Estimate]] = field(default_factory=dict)
    """Per concurrency, every layout, the ones that fit first, by GPU-seconds per 1,000 requests."""

    def best(self, concurrency: int, by: str = "gpu_s_per_1k") -> Estimate | None:
        fitting = [e for e in self.levels[concurrency] if e.fits]
        return min(fitting, key=lambda e: getattr(e, by)) if fitting else None

    def to_dict(self) -> dict[str, Any]:
        def row(e: Estimate) -> dict[str, Any]:
            return {**asdict(e), "layout": e.layout.name, "layout_degrees": asdict(e.layout)}

        return {"model": self.model, "hardware": asdict(self.hardware), "gpus": self.gpus, "traffic": self.traffic,
                "input_mean": self.input_mean, "output_mean": self.output_mean,
                "calibration": asdict(self.calibration), "routing": self.routing,
                "levels": {str(c): [row(e) for e in rows] for c, rows in self.levels.items()}}


def estimate(spec: ModelSpec, hw: Hardware, layout: Layout, concurrency: int, input_mean: float, output_mean: float,
             fit: DecodeFit | None = None, routing: RoutingProfile | None = None) -> Estimate:
    """One layout at one concurrency for a traffic of these mean prompt and output lengths."""
    rows = max(1, math.ceil(concurrency / layout.dp))
    context = int(input_mean + output_mean / 2)  # a decoding sequence's mean cached length
    step = decode_step(spec, hw, layout, rows, context, fit, routing)
    ttft = prefill_s(spec, hw, layout, max(1, int(input_mean)))
    # A replica spends each request's prefill on it alone and shares each decode step among its rows; with fewer
    # sequences than replicas, the idle ones are paid for all the same (concurrency / dp rows on average).
    per_request = (output_mean * step.total_s / (concurrency / layout.dp) + ttft) * layout.replica_gpus
    held = held_bytes(spec, layout, int(rows * (input_mean + output_mean)))
    return Estimate(layout, concurrency, rows, held <= hw.usable_bytes(), held / 2**30, 1000 * per_request,
                    step.total_s, ttft, step.comm_s / step.total_s if step.total_s else 0.0)


def make_plan(spec: ModelSpec, hw: Hardware, gpus: int, profile: TrafficProfile,
              concurrency: tuple[int, ...] = DEFAULT_CONCURRENCY, calibration: Calibration | None = None,
              routing: RoutingProfile | None = None) -> Plan:
    if gpus < 1:
        raise ConfigError(f"--gpus {gpus}: must be at least 1")
    calibration = calibration or Calibration()
    hw = calibration.hardware(hw)
    options = layouts(spec, gpus)
    if not options:
        raise ConfigError(f"--gpus {gpus}: no layout of {spec.name} uses {gpus} GPUs (its heads and layers do not "
                          "divide); try another count")
    i, o = float(profile.input.mean), float(profile.output.mean)
    levels = {}
    for c in concurrency:
        rows = [estimate(spec, hw, layout, c, i, o, calibration.fit, routing) for layout in options]
        levels[c] = sorted(rows, key=lambda e: (not e.fits, e.gpu_s_per_1k))
    return Plan(spec.name, hw, gpus, profile.source, i, o, calibration, routing.source if routing else "", levels)


def render(plan: Plan, top: int = 5) -> str:
    """The plan as text: per concurrency the best layouts by GPU-seconds per 1,000 requests, and the fastest."""
    lines = [f"{plan.model} on {plan.gpus} x {plan.hardware.name}, traffic {plan.traffic} (mean prompt "
             f"{plan.input_mean:,.0f}, output {plan.output_mean:,.0f} tokens)"]
    c = plan.calibration
    if c.fit is not None:
        f = c.fit
        lines.append(f"calibration: decode fitted to {c.cells} measured cells of {c.source}: step = {f.gemv:.2f} "
                     f"(one row) or {f.gemm:.2f} (more) x weight bytes' time + {f.kv:.2f} x KV bytes' + "
                     f"{f.compute:.2f} x FLOPs' + {1e6 * f.overhead_s:.0f} us")
    else:
        lines.append("calibration: decode from the specification alone (--calibrate a bench decode RECORD fits it)")
    if plan.routing:
        lines.append(f"routing: experts read per step as {plan.routing} activates them")
    if c.link_bytes_s:
        lines.append(f"link: {c.link_bytes_s / 1e9:.1f} GB/s, {1e6 * c.link_latency_s:.1f} us per rank, measured by "
                     f"{c.link_source}")
    for concurrency, rows in plan.levels.items():
        lines += ["", f"concurrency {concurrency}:",
                  f"  {'layout':<16}{'GPU-s/1k req':>14}{'TPOT ms':>10}{'TTFT s':>9}{'comm':>7}{'GiB/GPU':>9}  fits"]
        for e in rows[:top]:
            lines.append(f"  {e.layout.name:<16}{e.gpu_s_per_1k:>14,.1f}{1000 * e.tpot_s:>10.2f}{e.ttft_s:>9.3f}"
                         f"{100 * e.comm_share:>6.0f}%{e.gib_per_gpu:>9.1f}  {'yes' if e.fits else 'NO'}")
        fastest = plan.best(concurrency, "tpot_s")
        if fastest is not None:
            lines.append(f"  lowest latency: {fastest.layout.name} ({1000 * fastest.tpot_s:.2f} ms per token)")
        else:
            lines.append("  no layout holds the model and this many sequences")
    return "\n".join(lines)
