"""`athanor bench decode`: per-token decode time of candidates through the engine's captured path, and its share
of the HBM roofline, over a grid of batches and contexts.

The model (a preset with random weights, or any name `load_model` takes) is loaded once in this process; each
cell builds an `Engine` (the worker's state, without its transport) with CUDA graphs on and a single bucket
equal to the batch, swaps the candidate in, and times back-to-back `runner.step`s (input copy, graph replay of
decode + greedy sampling, output copy: what serving does per step) on device events. Every row decodes at
position `context`, so attention reads `context` keys per row (the KV contents are whatever the cache holds:
timing does not depend on them).

Roofline: the bytes one step must read (`timing.step_bytes`: weights, an MoE layer's experts counted as the
distinct ones a batch activates under the routing profile, plus every row's KV) over the device's copy bandwidth.
A cell whose KV cache, or whose step's working memory beside it, does not fit is recorded as `does_not_fit`;
a cell that fails otherwise is recorded with its error (status `declined` where the candidate names what it does not
compute, e.g. the fast template on a model beyond its kernels), and the next cell runs.
"""

from __future__ import annotations

import dataclasses
import functools
import gc
import logging
import tempfile
import time
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from athanor.bench.kernel_profile import autotuned_configs, kernel_profile
from athanor.bench.record import default_device, default_dtype, provenance
from athanor.bench.timing import copy_bandwidth, step_bytes, time_steps
from athanor.errors import ConfigError
from athanor.model import Model, ModelSpec
from athanor.model.spec import kv_cache_bytes

if TYPE_CHECKING:
    from athanor.traffic.routing import RoutingProfile

log = logging.getLogger(__name__)

COMPILE_SUFFIX = "+compile"
"""A candidate named with this suffix ("reference+compile") runs under torch.compile."""

STEP_OUT_OF_MEMORY = "the step's working memory beside the KV cache"
"""How a `does_not_fit` record's error begins when the KV cache fit but the step ran out of memory beside it."""

HEADROOM_BYTES = 2 << 30
"""Free memory a cell keeps beside its KV cache for activations, graphs and fused weight copies."""


def out_of_memory_in_step(record: dict[str, Any]) -> bool:
    """Whether a `does_not_fit` record is a step out of memory beside a KV cache that fit (not the cache itself)."""
    return str(record.get("error", "")).startswith(STEP_OUT_OF_MEMORY)


def candidate_source(candidate: str, spec: ModelSpec, use_compile: bool, device: str) -> tuple[str, str]:
    """(source, label) for "reference", "best" or a candidate file; `use_compile` sets its compile option."""
    from athanor.moves.best import best_options
    from athanor.moves.render import read_options, render, template_source

    if candidate == "reference":
        if use_compile:  # the reference's computation in the template, under torch.compile
            return render(template_source("fast"), {"compile": "default"}), "reference" + COMPILE_SUFFIX
        from athanor.engine.candidate import baseline_candidate

        return baseline_candidate().source, "reference"
    if candidate == "best":
        options = best_options(spec, device)
        if use_compile:
            options["compile"] = "default"
        return render("fast", options), "best" + (COMPILE_SUFFIX if use_compile else "")
    path = Path(candidate)
    if not path.is_file():
        raise ConfigError(f"--candidate {candidate}: no such file (or use 'reference' / 'best')")
    source = path.read_text()
    if use_compile:
        source = render(source, {**read_options(source), "compile": "default"})
    return source, str(path) + (COMPILE_SUFFIX if use_compile else "")


def parse_candidates(text: str, use_compile: bool = False) -> list[tuple[str, bool]]:
    """(candidate, under torch.compile) for each of "reference,best,reference+compile,FILE"; `use_compile`
    compiles them all. A file that does not exist is the user's mistake, said before any model loads."""
    items = [s.strip() for s in text.split(",") if s.strip()]
    if not items:
        raise ConfigError("--candidate: name at least one of reference, best or a candidate file")
    out = []
    for item in items:
        name = item.removesuffix(COMPILE_SUFFIX)
        if name not in ("reference", "best") and not Path(name).is_file():
            raise ConfigError(f"--candidate {item}: no such file (or use 'reference' / 'best')")
        out.append((name, use_compile or item.endswith(COMPILE_SUFFIX)))
    return out


def replay_routing(model: Model, profile_path: str | None, max_batch: int) -> tuple[Model, RoutingProfile]:
    """`model` with router biases fitted to a routing profile (a JSON file, or Zipf-parametric).

    The fit runs the reference over real English text (the traffic corpus, as UTF-8 bytes: random
    presets have no tokenizer, and replay needs the token correlations of text, not noise).
    """
    from athanor.traffic.corpus import sentences
    from athanor.traffic.routing import apply_router_bias, fit_router_bias, load_routing, parametric_routing

    spec, moe = model.spec, model.spec.moe
    assert moe is not None
    if profile_path:
        profile = load_routing(profile_path, spec)
    else:
        profile = parametric_routing(spec.num_layers, moe.num_experts, moe.top_k, max_batch=max_batch)
    texts = [[b + 1 for b in s.encode()][:64] for s in sentences()[:48]]
    biases = fit_router_bias(model, profile, texts, passes=2, iters=200)
    return apply_router_bias(model, biases, profile.source), profile


def load_for_decode(model_name: str, device: str, dtype: str, routing: str | None = None,
                    max_batch: int = 1) -> tuple[Model, RoutingProfile | None]:
    """The model on `device` in `dtype`; an MoE model with its routing replayed (`replay_routing`)."""
    from athanor.model.registry import load_model

    model = load_model(model_name, device=torch.device(device), dtype=getattr(torch, dtype))
    if model.spec.moe is None:
        return model, None
    return replay_routing(model, routing, max_batch=max_batch)


def decode_cell(model_name: str, batch: int, context: int, candidate: str = "reference", use_compile: bool = False,
                device: str = "cuda", dtype: str = "bfloat16", iters: int = 50, min_time_s: float = 1.0,
                model: Model | None = None, profile: RoutingProfile | None = None, kernels: bool = False,
                windows: int = 0) -> dict[str, Any]:
    """Time one (batch, context, candidate) cell of `model` (loaded here when not given); its JSON-ready record.

    `windows`: after the timing, time the same captured step `windows` times more, each as long, into `window_ms`:
    whether the figure is the step's steady state or a transient after the capture.
    `kernels`: also profile the timed step on CUDA (`kernel_profile.kernel_profile`).
    `profile`: the RoutingProfile an MoE `model` replays (the record cites it, and its distinct experts per
    batch price the roofline); Zipf-parametric when not given.
    """
    if batch < 1 or context < 1:
        raise ConfigError("--batch and --context must be at least 1")
    from athanor.engine import protocol as p
    from athanor.engine.candidate import Candidate
    from athanor.engine.config import EngineConfig
    from athanor.engine.core import Engine
    from athanor.engine.graphs import StepInputs

    dev = torch.device(device)
    record: dict[str, Any] = {"model": model_name, "batch": batch, "context": context, "candidate": candidate,
                              "compile": use_compile}
    if model is None:
        model, profile = load_for_decode(model_name, device, dtype, max_batch=batch)
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
        if kv + HEADROOM_BYTES > free:
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
        try:
            t = time.perf_counter()
            reply = engine.swap(p.SwapRequest(Candidate.from_source(source, description=label)))
            record["swap_s"] = time.perf_counter() - t
            if reply.status != "ok":
                # A step whose own working memory does not fit beside the KV cache (the reference gathers each
                # layer's whole cache for the batch) does not fit either.
                last = (reply.error.strip().splitlines() or [""])[-1]
                if "OutOfMemoryError" in reply.error:
                    record.update(status="does_not_fit", error=f"{STEP_OUT_OF_MEMORY} ({kv / 2**30:.1f} GiB): {last}",
                                  traceback=reply.error[-2000:])
                elif last.startswith("NotImplementedError"):  # a candidate that names what it does not compute
                    record.update(status="declined", error=last, traceback=reply.error[-2000:])
                else:
                    record.update(status="error", error=reply.error[-2000:])
                return record
            record["swap"] = dataclasses.asdict(dataclasses.replace(reply, error=""))
            runner = engine.residents[reply.candidate_id].runner
            record["used_graph"] = runner.captured
            rows = torch.arange(batch, device=dev)
            pos = torch.full((batch,), context, dtype=torch.long, device=dev)
            x = StepInputs(tokens=rows % 100, positions=pos, slots=rows, seq_lens=pos,
                           temperature=torch.zeros(batch, device=dev), top_p=torch.ones(batch, device=dev),
                           seeds=rows)

            def step() -> Any:
                return runner.step(x, greedy=True)  # temperature 0

            seconds = time_steps(step, dev, iters, min_time_s)
            if windows:
                record["window_ms"] = [1000 * time_steps(step, dev, iters, min_time_s) for _ in range(windows)]
            if kernels and dev.type == "cuda":
                record.update(kernel_profile(step, dev, step_us=1e6 * seconds, layers=spec.num_layers))
            record["autotuned"] = autotuned_configs()
        finally:
            engine.close()
    record["status"] = "ok"
    record["ms_per_token"] = 1000 * seconds
    if "copy_bandwidth_bytes_s" in record:
        roofline_s = record["total_bytes"] / record["copy_bandwidth_bytes_s"]
        record["roofline_ms"] = 1000 * roofline_s
        record["roofline_share"] = roofline_s / seconds
    return record


def bench_decode(model_name: str, batches: Sequence[int], contexts: Sequence[int], candidates: str = "reference",
                 use_compile: bool = False, device: str | None = None, dtype: str = "", iters: int = 50,
                 min_time_s: float = 1.0, routing: str | None = None, kernels: bool = False,
                 windows: int = 0, status: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Every cell of candidates x batches x contexts, the model loaded once; one record with a `cells` list.

    `candidates`: comma-separated "reference", "best", candidate files, each optionally "+compile".
    `status`: told what runs (the model's load, then each cell, with how many are done) between cells, never
    while one is timed.
    """
    if not batches or not contexts or min(*batches, *contexts) < 1:
        raise ConfigError("--batch and --context must be at least 1")
    device = default_device(device)
    dtype = default_dtype(device, dtype)
    chosen = parse_candidates(candidates, use_compile)
    record: dict[str, Any] = {"benchmark": "decode", "model": model_name, "dtype": dtype, "iters": iters,
                              "routing": routing or "", **provenance(device)}
    show = status or (lambda text: None)
    show(f"loading {model_name}")
    model, profile = load_for_decode(model_name, device, dtype, routing, max_batch=max(batches))
    cells: list[dict[str, Any]] = []
    total = len(chosen) * len(batches) * len(contexts)
    for candidate, compiled in chosen:
        for batch in batches:
            for context in contexts:
                label = candidate + (COMPILE_SUFFIX if compiled else "")
                show(f"cell {len(cells) + 1} of {total}: {model_name} {label}, batch {batch}, context {context}")
                t = time.perf_counter()
                cell = guarded_cell(
                    functools.partial(decode_cell, model_name, batch, context, candidate, compiled, device, dtype,
                                      iters, min_time_s, model=model, profile=profile, kernels=kernels,
                                      windows=windows),
                    {"model": model_name, "batch": batch, "context": context, "candidate": candidate,
                     "compile": compiled}, device)
                cell["cell_s"] = time.perf_counter() - t
                log.info("%s b=%d ctx=%d %s: %s", model_name, batch, context, candidate, cell["status"])
                cells.append(cell)
    record["cells"] = cells
    return record


def guarded_cell(make: Callable[[], dict[str, Any]], identity: dict[str, Any], device: str) -> dict[str, Any]:
    """`make()`'s record or, when it fails otherwise than by the user's mistake (a ConfigError), `identity` with the
    error: recorded, and the next cell runs. The cell's memory is released either way."""
    try:
        cell = make()
    except ConfigError:
        raise
    except Exception as e:
        cell = {**identity, "status": "error", "error": f"{type(e).__name__}: {e}",
                "traceback": traceback.format_exc()[-4000:]}
    gc.collect()
    if torch.device(device).type == "cuda":
        torch.cuda.empty_cache()
    return cell


def cell_line(cell: dict[str, Any]) -> str:
    """One line for a cell: its ms/token and share of the roofline, or why there is none."""
    label = cell.get("candidate_label") or cell["candidate"] + (COMPILE_SUFFIX if cell.get("compile") else "")
    head = f"{cell['model']} b={cell['batch']} ctx={cell['context']} {label}"
    if cell["status"] == "ok":
        share = cell.get("roofline_share")
        return f"{head}: {cell['ms_per_token']:.3f} ms/token" + (f", {100 * share:.0f}% of HBM roofline"
                                                                  if share else "")
    # the error's last line (a candidate's traceback ends with its exception); the whole of it is in the record
    why = (str(cell.get("error", "")).strip().splitlines() or [""])[-1]
    return f"{head}: {cell['status']}: {why}"
