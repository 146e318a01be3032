"""`athanor bench swap`: what a persistent engine saves over a cold start per experiment.

Measures, on one model loaded by the worker from files on disk:
- cold start: process spawn to the baseline built and its first decode step done;
- swap: candidate sent to graphs recaptured and first decode step done (median of N swaps
  between two candidates, timed at the caller, so transport is included);
- one experiment: swap a challenger in beside the incumbent, check its prefill and decode
  logits against the incumbent (the reference) on the same inputs, time a few decode steps;
- respawn: a candidate that aborts the worker, to the engine answering again with the incumbent.
"""

from __future__ import annotations

import dataclasses
import logging
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from athanor.bench.record import provenance
from athanor.engine import protocol as p
from athanor.engine.candidate import Candidate, baseline_candidate
from athanor.engine.client import check
from athanor.engine.config import EngineConfig
from athanor.engine.supervisor import Supervisor
from athanor.errors import VerificationError

log = logging.getLogger(__name__)

COMPILED_MLP = (
    "\n\n_reference_build = build\n"
    "def build(model, ctx):\n"
    "    forward = _reference_build(model, ctx)\n"
    "    forward._mlp = torch.compile(forward._mlp, dynamic=False)\n"
    "    return forward\n"
)


def model_on_disk(name: str, directory: Path, dtype: str) -> str:
    """A path the worker loads from files: presets with random weights are saved as an HF directory first."""
    from athanor.model.registry import DEFAULT_MODEL, load_model, preset_of

    if name == DEFAULT_MODEL:
        load_model(name)  # converts the embedded GGUF to its on-disk HF copy once
        return name
    if preset_of(name) is None:
        return name
    from athanor.model.hf import save_hf

    model = load_model(name, dtype=getattr(torch, dtype) if dtype else None)
    save_hf(model, directory, hf_exact=False)  # only the engine reads it
    return str(directory)


def _timed(fn: Any) -> tuple[float, Any]:
    t = time.perf_counter()
    out = fn()
    return time.perf_counter() - t, out


def experiment(engine: Supervisor, challenger: Candidate, incumbent: str, atol: float) -> dict[str, Any]:
    """Swap `challenger` in beside the incumbent, verify it against the incumbent, time it."""
    prompts = [[(7 * i + j) % 100 + 1 for j in range(12 + 3 * i)] for i in range(min(4, engine.config.max_seqs))]
    slots = list(range(len(prompts)))
    check(engine.swap(challenger, keep_incumbent=True))
    diffs: list[torch.Tensor] = []
    for cid in (incumbent, challenger.id):
        logits = check(engine.prefill(prompts, slots, return_logits=True, candidate_id=cid)).logits
        assert logits is not None
        diffs.append(logits)
    prefill_diff = float((diffs[0] - diffs[1]).abs().max())
    positions = [len(q) for q in prompts]
    steps: list[torch.Tensor] = []
    for cid in (incumbent, challenger.id):
        logits = check(engine.decode([1] * len(slots), positions, slots, return_logits=True, candidate_id=cid)).logits
        assert logits is not None
        steps.append(logits)
    decode_diff = float((steps[0] - steps[1]).abs().max())
    if max(prefill_diff, decode_diff) > atol:
        raise VerificationError(f"challenger {challenger.id}: logits differ from the incumbent by "
                                f"{max(prefill_diff, decode_diff):.3g} (> {atol})")
    timing = check(engine.measure(p.MeasureRequest("decode", batch_size=1, context_len=32, iters=10, warmup=2,
                                                   candidate_id=challenger.id)))
    check(engine.activate(incumbent))
    check(engine.drop(challenger.id))
    return {"max_abs_diff": max(prefill_diff, decode_diff), "decode_step_s": statistics.median(timing.times_s),
            "used_graph": timing.used_graph}


def bench_swap(model: str, device: str = "cpu", dtype: str = "", num_swaps: int = 10, max_seqs: int = 8,
               max_seq_len: int = 256, cpu_threads: int = 0, with_compile: bool = False) -> dict[str, Any]:
    """Run the swap benchmark; returns the JSON-ready record."""
    with tempfile.TemporaryDirectory(prefix="athanor-bench-") as tmp:
        path = model_on_disk(model, Path(tmp) / "model", dtype)
        config = EngineConfig(model=path, device=device, dtype=dtype, max_seqs=max_seqs, max_seq_len=max_seq_len,
                              cpu_threads=cpu_threads)
        base = baseline_candidate()
        twin = Candidate.from_source(base.source + "\n# the same forward, another candidate\n",
                                     parent=base.manifest.content_hash, description="baseline twin")
        record: dict[str, Any] = {"benchmark": "swap", "model": model, "config": dataclasses.asdict(config),
                                  **provenance(device)}
        with Supervisor(config, incumbent=base) as engine:
            record["cold_start_s"] = engine.start()
            record["sandbox"] = list(engine.health().sandbox)
            swaps, worker_side = [], []
            for i in range(num_swaps):
                seconds, reply = _timed(lambda i=i: check(engine.swap(twin if i % 2 == 0 else base)))
                swaps.append(seconds)
                worker_side.append(reply.total_s)
            record["swap_s"] = statistics.median(swaps)
            record["swap_all_s"] = swaps
            record["swap_worker_side_s"] = statistics.median(worker_side)
            record["graph_safe"] = reply.graph_safe
            check(engine.swap(base))
            challenger = Candidate.from_source(base.source + "\n# challenger\n", parent=base.manifest.content_hash)
            atol = 1e-4 if not dtype or dtype == "float32" else 2e-2
            record["experiment_s"], record["experiment"] = _timed(lambda: experiment(engine, challenger, base.id, atol))
            crash = Candidate.from_source("SEAM_VERSION = 2\nimport os\ndef build(model, ctx):\n    os.abort()\n")
            record["respawn_s"], reply = _timed(lambda: engine.swap(crash))
            record["respawn_verdict"] = reply.status
            record["respawn_worker_start_s"] = engine.last_start_s
            check(engine.decode([1], [0], [0]))
            if with_compile:
                compiled = Candidate.from_source(base.source + COMPILED_MLP, description="torch.compile'd MLP")
                record["compile_swap_first_s"], _ = _timed(lambda: check(engine.swap(compiled)))
                check(engine.swap(base))
                again = Candidate.from_source(compiled.source + "\n# warm caches\n")
                record["compile_swap_warm_s"], _ = _timed(lambda: check(engine.swap(again)))
            record["stats"] = dataclasses.asdict(engine.stats())
    return record
