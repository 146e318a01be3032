"""A/A noise of the evaluator: the reference (under another id) against itself, on CPU or a GPU.

Writes evaluate_noise_<device>.json (under --out, default bench/results) with, per run, the A/A
and A/B intervals, and per timed shape the pairs, the statistic used (per-pair median or quartile
ratio), each side's robust coefficient of variation and the incumbent's run-to-run spread, plus
the load average, the device, the versions and the commit. Target: within ±5% on CPU, ±2% on an
H200 for a whole-model decode step.

    python bench/evaluate_noise.py --model tiny-dense --device cpu --runs 3
    python bench/evaluate_noise.py --model llama-3.2-1b --device cuda --dtype bfloat16 --tier slow \
        --max-seqs 8 --max-seq-len 512 --pairs 200 --budget 1.5 --runs 3
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from _record import write
from athanor.engine.candidate import Candidate, baseline_candidate
from athanor.evaluate import EvaluateConfig, Evaluator


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="tiny-dense")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="")
    ap.add_argument("--tier", default="fast")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--pairs", type=int, default=64, help="timed decode steps per shape at least")
    ap.add_argument("--prefill-pairs", type=int, default=48)
    ap.add_argument("--budget", type=float, default=EvaluateConfig.timing_budget_s,
                    help="seconds of timed runs per shape (EvaluateConfig.timing_budget_s)")
    ap.add_argument("--max-seqs", type=int, default=4)
    ap.add_argument("--max-seq-len", type=int, default=96)
    ap.add_argument("--out", default=str(Path(__file__).parent / "results"))
    args = ap.parse_args()
    base = baseline_candidate()
    twin = Candidate.from_source(base.source + "\n# the same forward under another id\n")
    config = EvaluateConfig(model=args.model, device=args.device, dtype=args.dtype, tier=args.tier,
                            max_seqs=args.max_seqs, max_seq_len=args.max_seq_len, decode_pairs=args.pairs,
                            prefill_pairs=args.prefill_pairs, timing_budget_s=args.budget)
    rows = []
    with Evaluator(config) as ev:
        for _ in range(args.runs):
            load_before = os.getloadavg()[0]
            t = time.perf_counter()
            v = ev.evaluate(twin, base)
            tier = v.tiers[-1] if v.tiers else None
            rows.append({
                "stage": v.stage, "accepted": v.accepted, "reason": v.reason, "wall_s": time.perf_counter() - t,
                "load_1min": [load_before, os.getloadavg()[0]], "speedup": dataclasses.asdict(v.speedup),
                "aa": dataclasses.asdict(tier.noise) if tier else None,
                "shapes": [{k: getattr(m, k) for k in ("kind", "batch_size", "tokens", "context_len", "num_layers",
                                                       "incumbent_s", "candidate_s", "paired", "incumbent_cv",
                                                       "candidate_cv", "repeatability")}
                           | {"num_pairs": m.speedup.num_pairs, "speedup": dataclasses.asdict(m.speedup)}
                           for m in (tier.measurements if tier else ())],
            })
            if tier:
                print(f"A/B {v.speedup.ci_low:.4f}..{v.speedup.ci_high:.4f}  A/A {tier.noise.ci_low:.4f}.."
                      f"{tier.noise.ci_high:.4f}  pairs>={tier.noise.num_pairs}  load {os.getloadavg()[0]:.2f}",
                      flush=True)
            else:
                print(v.reason, flush=True)
    config_record = {k: v for k, v in dataclasses.asdict(config).items() if k != "timeouts"}
    out = Path(args.out) / f"evaluate_noise_{args.device.replace(':', '')}.json"
    write({"model": args.model, "config": config_record, "runs": rows}, out)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
