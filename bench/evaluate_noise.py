"""A/A noise of the evaluator: the reference (under another id) against itself, on CPU or a GPU.

Writes bench/results/evaluate_noise_<device>.json with the A/A and A/B intervals, the device, the
versions and the commit. Target: within ±5% on CPU, ±2% on an H200 for a whole-model decode step.

    python bench/evaluate_noise.py --model tiny-dense --device cpu --runs 3
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import platform
import subprocess
from pathlib import Path

from athanor.engine.candidate import Candidate, baseline_candidate
from athanor.evaluate import EvaluateConfig, Evaluator
from athanor.evaluate.cascade import versions


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="tiny-dense")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="")
    ap.add_argument("--tier", default="fast")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--pairs", type=int, default=64)
    args = ap.parse_args()
    base = baseline_candidate()
    twin = Candidate.from_source(base.source + "\n# the same forward under another id\n")
    config = EvaluateConfig(model=args.model, device=args.device, dtype=args.dtype, tier=args.tier, max_seqs=4,
                            max_seq_len=96, decode_pairs=args.pairs, prefill_pairs=48)
    rows = []
    with Evaluator(config) as ev:
        for _ in range(args.runs):
            v = ev.evaluate(twin, base)
            tier = v.tiers[-1] if v.tiers else None
            rows.append({"stage": v.stage, "accepted": v.accepted, "speedup": dataclasses.asdict(v.speedup),
                         "aa": dataclasses.asdict(tier.noise) if tier else None})
            print(f"A/B {v.speedup.ci_low:.3f}..{v.speedup.ci_high:.3f}  A/A "
                  f"{tier.noise.ci_low:.3f}..{tier.noise.ci_high:.3f}" if tier else v.reason)
    out = Path(__file__).parent / "results" / f"evaluate_noise_{args.device.replace(':', '')}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        commit = ""
    env = {"device": args.device, "host": platform.node(), "git_commit": commit, **versions()}
    out.write_text(json.dumps({"env": env, "model": args.model, "runs": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
