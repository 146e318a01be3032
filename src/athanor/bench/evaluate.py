"""`athanor bench evaluate`: the evaluator's noise floor and its verdict on a planted faster candidate.

A/A: the reference forward under another id against itself, `runs` times on one evaluator; each run's A/A
interval (the incumbent against its twin) and A/B interval (the twin against the reference) should sit within
the device's noise target: +-5% on a CPU, +-2% for a whole-model decode step on an H200. Then the planted
candidate: the reference judged against an incumbent that does needless device work every decode step, which
the evaluator must accept as faster. Per timed shape the record keeps the pairs, the statistic used, each
side's robust coefficient of variation and the incumbent's run-to-run spread.
"""

from __future__ import annotations

import dataclasses
import os
import time
from typing import Any

from athanor.bench.record import default_device, provenance
from athanor.engine.candidate import Candidate, baseline_candidate
from athanor.errors import ConfigError
from athanor.evaluate import EvaluateConfig, Evaluator, Verdict


def slowed_incumbent(device: str) -> Candidate:
    """The reference plus needless matmuls every decode step, folded into its logits as `0 * y`: real work that a
    faster candidate (the reference itself) is honestly faster than. On CUDA about 24 x 8 MB of extra reads (about
    a tenth of a 1B model's bf16 step); on the CPU three small matmuls."""
    size, rounds = (2048, 24) if device.startswith("cuda") else (192, 3)
    base = baseline_candidate()
    body = (
        "\n\n_reference_build = build\n"
        "def build(model, ctx):\n"
        "    forward = _reference_build(model, ctx)\n"
        "    decode = forward.decode\n"
        f"    w = torch.randn({size}, {size}, device=ctx.device, dtype=ctx.dtype) / {size ** 0.5:g}\n"
        "    def slow_decode(batch):\n"
        "        y = w\n"
        f"        for _ in range({rounds}):\n"
        "            y = torch.tanh(y @ w)\n"
        "        return decode(batch) + 0 * y[0, 0]\n"
        "    forward.decode = slow_decode\n"
        "    return forward\n"
    )
    return Candidate.from_source(base.source + body, description="the reference plus needless device work")


def _run(verdict: Verdict, wall_s: float, load_before: float) -> dict[str, Any]:
    """One verdict's figures: its intervals and, per timed shape, the statistics behind them."""
    tier = verdict.tiers[-1] if verdict.tiers else None
    shapes = [{k: getattr(m, k) for k in ("kind", "batch_size", "tokens", "context_len", "num_layers", "incumbent_s",
                                          "candidate_s", "paired", "incumbent_cv", "candidate_cv", "repeatability")}
              | {"num_pairs": m.speedup.num_pairs, "speedup": dataclasses.asdict(m.speedup)}
              for m in (tier.measurements if tier else ())]
    return {"stage": verdict.stage, "accepted": verdict.accepted, "reason": verdict.reason, "wall_s": wall_s,
            "load_1min": [load_before, os.getloadavg()[0]], "speedup": dataclasses.asdict(verdict.speedup),
            "aa": dataclasses.asdict(tier.noise) if tier else None, "shapes": shapes}


def bench_evaluate(config: EvaluateConfig, runs: int = 3) -> dict[str, Any]:
    """`runs` A/A verdicts and one verdict on the planted faster candidate, on one evaluator; the record."""
    if runs < 1:
        raise ConfigError("--runs must be at least 1")
    config = dataclasses.replace(config, device=default_device(config.device))
    base = baseline_candidate()
    twin = Candidate.from_source(base.source + "\n# the same forward under another id\n")
    record: dict[str, Any] = {"benchmark": "evaluate", "model": config.model,
                              "config": {k: v for k, v in dataclasses.asdict(config).items() if k != "timeouts"},
                              **provenance(config.device)}
    aa = []
    with Evaluator(config) as ev:
        for _ in range(runs):
            load, t = os.getloadavg()[0], time.perf_counter()
            aa.append(_run(ev.evaluate(twin, base), time.perf_counter() - t, load))
        load, t = os.getloadavg()[0], time.perf_counter()
        planted = _run(ev.evaluate(twin, slowed_incumbent(config.device)), time.perf_counter() - t, load)
    record["runs"] = aa
    record["planted"] = planted
    return record


def summary_lines(record: dict[str, Any]) -> list[str]:
    """Each A/A run's intervals, then the planted candidate's verdict."""
    lines = []
    for r in record["runs"]:
        if r["aa"] is None:
            lines.append(f"A/A: {r['stage']}: {r['reason']}")
            continue
        s, n = r["speedup"], r["aa"]
        lines.append(f"A/B [{s['ci_low']:.4f}, {s['ci_high']:.4f}]  A/A [{n['ci_low']:.4f}, {n['ci_high']:.4f}]  "
                     f"pairs >= {n['num_pairs']}  load {r['load_1min'][1]:.2f}")
    p = record["planted"]
    verdict = "accepted" if p["accepted"] else f"not accepted ({p['stage']}: {p['reason']})"
    lines.append(f"{record['model']} on {record['device_name']}: planted faster candidate {verdict}, "
                 f"x{p['speedup']['median']:.3f} [{p['speedup']['ci_low']:.3f}, {p['speedup']['ci_high']:.3f}]")
    return lines
