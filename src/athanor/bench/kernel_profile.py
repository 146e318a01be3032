"""Where a decode step's time goes on the device (`athanor bench decode --kernels`): per-kernel time, the step's
critical path, and the configs Triton's autotuner picked."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch


def kernel_profile(step: Callable[[], Any], dev: torch.device, step_us: float, steps: int = 20, top: int = 30,
                   layers: int = 0) -> dict[str, Any]:
    """Per-kernel microseconds per step (kernels inside CUDA graphs included), their sum, the rest of `step_us`
    (gaps between kernels: launch gaps and host waits), and the step's critical path (`critical_path`)."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize(dev)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            step()
        torch.cuda.synchronize(dev)
    rows = []
    for e in prof.key_averages():
        if e.device_type != DeviceType.CUDA:
            continue
        us = float(getattr(e, "self_device_time_total", 0.0) or getattr(e, "self_cuda_time_total", 0.0))
        rows.append({"name": e.key[:120], "calls_per_step": e.count / steps, "us_per_step": us / steps})
    rows.sort(key=lambda r: -r["us_per_step"])
    total = sum(r["us_per_step"] for r in rows)
    spans = [(e.name[:120], float(e.time_range.start), float(e.time_range.end)) for e in prof.events()
             if e.device_type == DeviceType.CUDA and e.time_range.end > e.time_range.start]
    return {"kernels": rows[:top], "kernel_count_per_step": sum(r["calls_per_step"] for r in rows),
            "kernel_us_per_step": total, "gap_us_per_step": step_us - total,
            **critical_path(spans, steps, layers, top)}


def critical_path(spans: list[tuple[str, float, float]], steps: int, layers: int = 0, top: int = 40) -> dict[str, Any]:
    """Each kernel's share of the wall of `steps` back-to-back steps on one stream, from its (name, start, end)
    spans (microseconds): a kernel owns the time from the later of its start and the previous kernel's end to
    its own end, and time with no kernel running is a gap. The shares and gaps sum to the wall, so they say
    what a kernel costs the step, where its profiled duration also counts the time it waits resident for the
    kernel before it (programmatic dependent launch).

    A name that runs a multiple of `layers` times a step is split by its place in the layer ("[1/3]": the
    first of three launches a layer), so a layer's projections, which share one kernel, come apart. Returns
    {"path": [{name, us_per_step, calls_per_step}], "path_gap_us_per_step", "path_us_per_step"}; nothing when
    the spans do not split evenly into steps."""
    if not spans or len(spans) % steps:
        return {}
    spans = sorted(spans, key=lambda s: s[1])
    per_step = len(spans) // steps
    counts: dict[str, int] = {}
    for name, _, _ in spans[:per_step]:
        counts[name] = counts.get(name, 0) + 1
    per_layer = {name: c // layers for name, c in counts.items() if layers and c % layers == 0 and c // layers > 1}
    own: dict[str, float] = {}
    calls: dict[str, int] = {}
    gaps, end = 0.0, spans[0][1]
    seen: dict[str, int] = {}
    for i, (name, start, stop) in enumerate(spans):
        if i % per_step == 0:
            seen = {}
        k = seen.get(name, 0)
        seen[name] = k + 1
        label = f"{name}[{k % per_layer[name] + 1}/{per_layer[name]}]" if name in per_layer else name
        gaps += max(0.0, start - end)
        own[label] = own.get(label, 0.0) + max(0.0, stop - max(start, end))
        calls[label] = calls.get(label, 0) + 1
        end = max(end, stop)
    path: list[dict[str, Any]] = [{"name": n, "us_per_step": us / steps, "calls_per_step": calls[n] / steps}
                                  for n, us in sorted(own.items(), key=lambda kv: -kv[1])]
    return {"path": path[:top], "path_gap_us_per_step": gaps / steps,
            "path_us_per_step": (sum(own.values()) + gaps) / steps}


def autotuned_configs() -> dict[str, dict[str, str]]:
    """The config Triton's autotuner picked for each shape of the fused-GEMV kernels this process ran (kernel ->
    tuning key -> config). Recorded with a cell because a process tunes afresh (unless its autotuning cache is
    carried), and two tunings of one shape may pick configs whose step times differ."""
    try:
        from athanor.kernels.jit.pinned import autotuners

        kernels = autotuners()
    except ImportError:  # no Triton
        return {}
    return {name.replace("_kernel", "_tuned"): {str(key): str(config) for key, config in kernel.cache.items()}
            for name, kernel in kernels.items() if getattr(kernel, "cache", None)}
