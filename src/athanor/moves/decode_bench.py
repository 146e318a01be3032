"""`athanor bench decode`: per-token decode time of a candidate through the engine's captured path,
and its share of the HBM roofline.

The model (a preset with random weights, or any name `load_model` takes) is loaded in this
process into an `Engine` (the worker's state, without its transport), the candidate is swapped
in with CUDA graphs on and a single bucket equal to the batch, and back-to-back `runner.step`s
(input copy, graph replay of decode + sampling, output copy: what serving does per step) are
timed on device events. Every row decodes at position `context`, so attention reads `context`
keys per row (the KV contents are whatever the cache holds: timing does not depend on them).

Roofline: bytes one step must read (weights, with MoE experts counted as the distinct experts a
batch activates under the routing profile, plus every row's KV) / the copy bandwidth measured
once with a large device-to-device copy.
"""

from __future__ import annotations

import dataclasses
import logging
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from athanor.errors import ConfigError
from athanor.kernels.dispatch import PINNED_CONFIGS
from athanor.model import Model, ModelSpec
from athanor.model.spec import kv_cache_bytes

if TYPE_CHECKING:
    from athanor.traffic.routing import RoutingProfile

log = logging.getLogger(__name__)

_bandwidth_cache: dict[str, float] = {}


def copy_bandwidth(device: torch.device, nbytes: int = 2 << 30, iters: int = 10) -> float:
    """Bytes/s moved by a large device-to-device copy (read + write counted), measured once per device."""
    key = str(device)
    if key not in _bandwidth_cache:
        src = torch.empty(nbytes, dtype=torch.uint8, device=device)
        dst = torch.empty_like(src)
        dst.copy_(src)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iters):
            dst.copy_(src)
        end.record()
        end.synchronize()
        _bandwidth_cache[key] = 2 * nbytes * iters / (start.elapsed_time(end) / 1000)
        del src, dst
        torch.cuda.empty_cache()
    return _bandwidth_cache[key]


def step_bytes(model: Model, batch: int, context: int, distinct_experts: float | None = None) -> dict[str, int]:
    """Bytes one decode step must read: weights (embedding rows aside) and the KV of `context` tokens per row."""
    spec = model.spec
    itemsize = model.dtype.itemsize
    weights = 0
    for name, t in model.weights.items():
        if name == "embed" and not spec.tie_embeddings:
            weights += batch * t.shape[1] * itemsize  # only the looked-up rows
        elif ".experts." in name and spec.moe is not None:
            used = distinct_experts if distinct_experts is not None else min(spec.moe.num_experts,
                                                                               batch * spec.moe.top_k)
            weights += int(t.numel() * itemsize * used / spec.moe.num_experts)
        else:
            weights += t.numel() * itemsize
    kv = 2 * spec.num_layers * batch * spec.num_kv_heads * context * spec.head_dim * itemsize
    return {"weight_bytes": weights, "kv_bytes": kv, "total_bytes": weights + kv}


def candidate_source(candidate: str, spec: ModelSpec, use_compile: bool, device: str) -> tuple[str, str]:
    """(source, label) for "reference", "best" or a candidate file; `use_compile` sets its compile option."""
    from athanor.moves.best import best_options
    from athanor.moves.render import read_options, render, template_source

    if candidate == "reference":
        if use_compile:  # the reference's computation in the template, under torch.compile
            return render(template_source("fast"), {"compile": "default"}), "reference+compile"
        from athanor.engine.candidate import baseline_candidate

        return baseline_candidate().source, "reference"
    if candidate == "best":
        options = best_options(spec, device)
        if use_compile:
            options["compile"] = "default"
        return render("fast", options), "best" + ("+compile" if use_compile else "")
    path = Path(candidate)
    if not path.is_file():
        raise ConfigError(f"--candidate {candidate}: no such file (or use 'reference' / 'best')")
    source = path.read_text()
    if use_compile:
        source = render(source, {**read_options(source), "compile": "default"})
    return source, str(path)


def replay_routing(model: Model, profile_path: str | None, max_batch: int) -> tuple[Model, RoutingProfile]:
    """`model` with router biases fitted to a routing profile (a JSON file, or Zipf-parametric).

    The fit runs the reference over real English text (the traffic corpus, as UTF-8 bytes: random
    presets have no tokenizer, and replay needs the token correlations of text, not noise).
    """
    import json

    from athanor.traffic.corpus import sentences
    from athanor.traffic.routing import RoutingProfile, apply_router_bias, fit_router_bias, parametric_routing

    spec, moe = model.spec, model.spec.moe
    assert moe is not None
    if profile_path:
        profile = RoutingProfile.from_dict(json.loads(Path(profile_path).read_text()))
    else:
        profile = parametric_routing(spec.num_layers, moe.num_experts, moe.top_k, max_batch=max_batch)
    texts = [[b + 1 for b in s.encode()][:64] for s in sentences()[:48]]
    biases = fit_router_bias(model, profile, texts, passes=2, iters=200)
    return apply_router_bias(model, biases, profile.source), profile


STEP_OUT_OF_MEMORY = "the step's working memory beside the KV cache"
"""How a `does_not_fit` record's error begins when the KV cache fit but the step ran out of memory beside it."""


def out_of_memory_in_step(record: dict[str, Any]) -> bool:
    """Whether a `does_not_fit` record is a step out of memory beside a KV cache that fit (not the cache itself)."""
    return str(record.get("error", "")).startswith(STEP_OUT_OF_MEMORY)


def bench_decode(model_name: str, batch: int, context: int, candidate: str = "reference", use_compile: bool = False,
                 device: str = "cuda", dtype: str = "bfloat16", iters: int = 50, min_time_s: float = 1.0,
                 routing: str | None = None, model: Model | None = None, profile: RoutingProfile | None = None,
                 kernels: bool = False, windows: int = 0) -> dict[str, Any]:
    """Time one (model, batch, context, candidate) cell; returns its JSON-ready record.

    `windows`: after the timing, time the same captured step `windows` times more, each as long, into `window_ms`:
    whether the figure is the step's steady state or a transient after the capture (a process's first cell read 2%
    slower than its next ones, steadily, until the engine captured a process's first graphs twice).

    `kernels`: also profile the timed step (torch.profiler, CUDA) into `kernels` (each kernel's
    calls and microseconds per step), `kernel_us_per_step` and `gap_us_per_step` (the step time
    that no kernel occupies: launch gaps and host waits).

    A cell whose KV cache does not fit next to the weights, or whose step runs out of memory beside it, is returned
    with `status: "does_not_fit"`.
    `model` may be passed to reuse loaded weights (already routed for MoE: then `profile` is the
    RoutingProfile it replays, which the record cites) across cells.
    """
    from athanor.engine import protocol as p
    from athanor.engine.candidate import Candidate
    from athanor.engine.config import EngineConfig
    from athanor.engine.core import Engine
    from athanor.engine.graphs import StepInputs
    from athanor.model.registry import load_model
    from athanor.provenance import environment

    if batch < 1 or context < 1:
        raise ConfigError("--batch and --context must be at least 1")
    dev = torch.device(device)
    record: dict[str, Any] = {"benchmark": "decode", "model": model_name, "batch": batch, "context": context,
                              "candidate": candidate, "compile": use_compile, "dtype": dtype, **environment(device)}
    if model is None:
        model = load_model(model_name, device=dev, dtype=getattr(torch, dtype))
        if model.spec.moe is not None:
            model, profile = replay_routing(model, routing, max_batch=max(batch, 1))
    spec = model.spec
    distinct = None
    if spec.moe is not None:
        if profile is None:
            from athanor.traffic.routing import parametric_routing

            profile = parametric_routing(spec.num_layers, spec.moe.num_experts, spec.moe.top_k, max_batch=batch)
        distinct = profile.distinct[min(batch, len(profile.distinct)) - 1]
        record["routing_source"] = profile.source
        record["distinct_experts_per_layer"] = distinct
    max_seq_len = context + 16
    kv = kv_cache_bytes(spec, batch + 1, max_seq_len, model.dtype.itemsize)
    record.update(step_bytes(model, batch, context, distinct))
    record["kv_cache_bytes"] = kv
    if dev.type == "cuda":
        free, _ = torch.cuda.mem_get_info(dev)
        record["free_bytes_before"] = free
        if kv + (2 << 30) > free:  # 2 GiB for activations, graphs and fused weight copies' headroom
            record["status"] = "does_not_fit"
            record["error"] = f"KV cache {kv / 2**30:.1f} GiB > free {free / 2**30:.1f} GiB - 2 GiB"
            return record
        record["copy_bandwidth_bytes_s"] = copy_bandwidth(dev)
    source, label = candidate_source(candidate, spec, use_compile, device)
    record["candidate_label"] = label
    with tempfile.TemporaryDirectory(prefix="athanor-bench-decode-") as tmp:
        config = EngineConfig(model=model_name, device=device, dtype=dtype, max_seqs=batch, max_seq_len=max_seq_len,
                              buckets=(batch,), scratch_dir=tmp)
        engine = Engine(config, model)
        t = time.perf_counter()
        reply = engine.swap(p.SwapRequest(Candidate.from_source(source, description=label)))
        record["swap_s"] = time.perf_counter() - t
        if reply.status != "ok":
            # A step whose own working memory does not fit beside the KV cache (the reference gathers each layer's
            # whole cache for the batch: 4 GiB a tensor for the 1B at batch 128, context 32k) does not fit either.
            if "OutOfMemoryError" in reply.error:
                last = reply.error.strip().splitlines()[-1]
                record.update(status="does_not_fit", error=f"{STEP_OUT_OF_MEMORY} ({kv / 2**30:.1f} GiB): {last}",
                              traceback=reply.error[-2000:])
            else:
                record.update(status="error", error=reply.error[-2000:])
            return record
        record["swap"] = dataclasses.asdict(dataclasses.replace(reply, error=""))
        runner = engine.residents[reply.candidate_id].runner
        record["used_graph"] = runner.captured
        rows = torch.arange(batch, device=dev)
        pos = torch.full((batch,), context, dtype=torch.long, device=dev)
        x = StepInputs(tokens=rows % 100, positions=pos, slots=rows, seq_lens=pos,
                       temperature=torch.zeros(batch, device=dev), top_p=torch.ones(batch, device=dev), seeds=rows)

        def step() -> Any:
            return runner.step(x, greedy=True)  # temperature 0

        times = time_steps(step, dev, iters, min_time_s)
        if windows:
            record["window_ms"] = [1000 * time_steps(step, dev, iters, min_time_s) for _ in range(windows)]
        if kernels and dev.type == "cuda":
            record.update(kernel_profile(step, dev, step_us=1e6 * times, layers=spec.num_layers))
        record["autotuned"] = autotuned_configs()  # the shapes the pinned table (jit.pinned) did not hold
        record["pinned_configs"] = PINNED_CONFIGS
        engine._release(engine.residents.pop(reply.candidate_id))
        engine._cleanup()
    record["status"] = "ok"
    record["ms_per_token"] = 1000 * times
    if "copy_bandwidth_bytes_s" in record:
        roofline_s = record["total_bytes"] / record["copy_bandwidth_bytes_s"]
        record["roofline_ms"] = 1000 * roofline_s
        record["roofline_share"] = roofline_s / times
    return record


def time_steps(step: Any, dev: torch.device, iters: int, min_time_s: float) -> float:
    """Seconds per step over at least `iters` back-to-back steps (and at least `min_time_s`)."""
    for _ in range(3):
        step()
    if dev.type != "cuda":
        t = time.perf_counter()
        for _ in range(iters):
            step()
        return (time.perf_counter() - t) / iters
    torch.cuda.synchronize(dev)
    t = time.perf_counter()
    step()
    torch.cuda.synchronize(dev)
    once = max(time.perf_counter() - t, 1e-6)
    n = max(iters, min(2000, int(min_time_s / once)))
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(n):
        step()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / 1000 / n


def kernel_profile(step: Any, dev: torch.device, step_us: float, steps: int = 20, top: int = 30,
                   layers: int = 0) -> dict[str, Any]:
    """Where one step's time goes on the device: per-kernel microseconds per step (kernels inside
    CUDA graphs included), their sum, and the rest of `step_us` (gaps between kernels); and the step's
    critical path (`critical_path`: each kernel's share of the wall, which sums to the step, where the
    per-kernel times overlap under programmatic dependent launch)."""
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
    for i, (name, start, stop) in enumerate(spans):
        if i % per_step == 0:
            seen: dict[str, int] = {}
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
    tuning key -> config). Recorded with a cell: the same code read 0.898 and 0.924 ms on the 1B in two device
    calls, its QKV kernel's share of the step 2.3 us a layer apart on the 1B and the 8B alike, and each call tunes
    afresh unless the autotuning cache is carried."""
    try:
        from athanor.kernels.jit.pinned import autotuners
        kernels = autotuners()
    except ImportError:  # no Triton
        return {}
    return {name.replace("_kernel", "_tuned"): {str(key): str(config) for key, config in kernel.cache.items()}
            for name, kernel in kernels.items() if getattr(kernel, "cache", None)}
