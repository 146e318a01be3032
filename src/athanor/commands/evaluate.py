"""`athanor evaluate CANDIDATE.py --model M`: run the evaluation cascade and print the verdict.

Exit status: 0 accepted, 1 rejected, 2 error (a user mistake, or the evaluator could not judge).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from athanor.errors import ConfigError

if TYPE_CHECKING:
    from athanor.evaluate import QualityBudget
    from athanor.evaluate.verdict import Verdict


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("evaluate", help="verify and time a candidate against an incumbent (the reference by default)")
    p.add_argument("candidate", help="the candidate's Python source (defines build(model, ctx))")
    p.add_argument("--model", default="smollm2-135m", help="name, preset, HF directory or .gguf file")
    p.add_argument("--device", default=None, help="cpu or cuda[:N] (default: CUDA when present, else cpu)")
    p.add_argument("--dtype", default="", help="float32, bfloat16, ... (default: as stored)")
    p.add_argument("--incumbent", default="", help="the incumbent's source (default: the reference forward)")
    p.add_argument("--tier", choices=("fast", "slow", "both"), default="fast")
    p.add_argument("--fast-layers", type=int, default=0, help="layers of the fast tier (0: as athanor compile sizes it)")
    p.add_argument("--traffic", default="preset:chat", help="a trace, a saved profile or preset:NAME")
    p.add_argument("--bitwise", action="store_true", help="demand logits identical to the reference's")
    p.add_argument("--quality-budget", default="",
                   help="admit a lossy candidate: 'kl=0.01,ppl=0.02' (mean KL, relative perplexity increase)")
    p.add_argument("--max-seqs", type=int, default=0, help="engine slots (0: as athanor compile sizes it)")
    p.add_argument("--max-seq-len", type=int, default=0, help="longest context (0: as athanor compile sizes it)")
    p.add_argument("--pairs", type=int, default=0, help="minimum timed decode pairs per shape (0: the tier's default)")
    p.add_argument("--margin", type=float, default=0.01, help="required speedup beyond 1 (lower CI bound)")
    p.add_argument("--seed", type=int, default=None, help="seed of inputs and fingerprints (default: fresh)")
    p.add_argument("--json", default="", help="write the verdict here")
    p.set_defaults(func=cmd_evaluate)


def parse_budget(text: str) -> QualityBudget | None:
    """The `--quality-budget` flag's budget; None when the flag is empty (quality mode off)."""
    from athanor.evaluate import QualityBudget

    return QualityBudget.parse(text) if text else None


def torch_device_type(device: str) -> str:
    return "cuda" if device.startswith("cuda") else "cpu"


def cmd_evaluate(args: argparse.Namespace) -> int:
    import dataclasses

    from athanor.engine.candidate import Candidate, baseline_candidate
    from athanor.evaluate import evaluate_candidate
    from athanor.loop.config import CompileConfig

    path = Path(args.candidate)
    if not path.is_file():
        raise ConfigError(f"{path}: no such candidate file (give a .py defining build(model, ctx))")
    if (args.pairs and args.pairs < 8) or args.fast_layers < 0 or args.max_seqs < 0 or args.max_seq_len < 0:
        raise ConfigError("--pairs must be at least 8; --fast-layers, --max-seqs and --max-seq-len positive")
    if args.dtype:
        import torch

        if not isinstance(getattr(torch, args.dtype, None), torch.dtype):
            raise ConfigError(f"--dtype {args.dtype}: not a torch dtype (float32, bfloat16, float16)")
    from athanor.model.device import resolve_device

    args.device = str(resolve_device(args.device))  # a one-line error for a device this machine lacks
    incumbent = baseline_candidate()
    if args.incumbent:
        if not Path(args.incumbent).is_file():
            raise ConfigError(f"--incumbent {args.incumbent}: no such file")
        incumbent = Candidate.from_file(args.incumbent)
    # The same sizing as `athanor compile` on this device, so a winner's verdict reproduces.
    sized = CompileConfig(model=args.model, traffic=args.traffic, device=torch_device_type(args.device),
                          dtype=args.dtype, bitwise=args.bitwise, quality=parse_budget(args.quality_budget),
                          max_seqs=args.max_seqs, max_seq_len=args.max_seq_len, fast_layers=args.fast_layers,
                          ).evaluate_config("slow" if args.tier == "slow" else "fast")
    config = dataclasses.replace(sized, device=args.device, tier=args.tier, margin=args.margin, seed=args.seed,
                                 decode_pairs=args.pairs or sized.decode_pairs)
    verdict = evaluate_candidate(Candidate.from_file(path), config, incumbent)
    explained = explain(verdict, args.margin, args.traffic)
    print(render(explained))
    if args.json:
        out = Path(args.json)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(explained, indent=1) + "\n")
    if verdict.status == "error":
        return 2
    return 0 if verdict.accepted else 1


def explain(verdict: Verdict, margin: float, traffic: str) -> dict[str, Any]:
    """The verdict's fields, with what a reader needs to judge it: the bar the speedup had to clear and what it is
    made of (`timing.bar`, against the last tier's A/A), and the traffic its shapes came from."""
    from athanor.evaluate.timing import bar

    threshold = bar(verdict.tiers[-1].noise, margin) if verdict.tiers else 1.0 + margin
    return {**verdict.to_dict(), "traffic": traffic,
            "bar": {"threshold": threshold, "margin": margin, "aa_bias": threshold - 1.0 - margin}}


def _known(x: Any) -> float | None:
    """A figure of the verdict's JSON, or None where it was not measured (None or NaN)."""
    return None if x is None or x != x else float(x)


def render(v: dict[str, Any]) -> str:
    """The verdict in one screen: what was decided where, the speedup against the bar it had to clear (and the noise
    floor in it), the correctness evidence, and the traffic and shapes timed."""
    head = "ACCEPTED" if v["accepted"] else ("ERROR" if v["status"] == "error" else "REJECTED")
    lines = [f"{head} at {v['stage']}: {v['reason']}"]
    s = v["speedup"]
    if s.get("median") is not None:
        lines.append(f"  speedup x{s['median']:.3f}  95% CI [{s['ci_low']:.3f}, {s['ci_high']:.3f}] over "
                     f"{s.get('num_pairs', 0)} timed pairs")
        if "bar" in v:
            b = v["bar"]
            lines.append(f"  the bar: the interval's lower bound must clear {b['threshold']:.3f} = 1 + margin "
                         f"{b['margin']:.3f} + the A/A bias {b['aa_bias']:.3f} (the noise floor: the incumbent timed "
                         "against its own twin)")
    for tier in v["tiers"]:
        err, agree, kl, ppl = (_known(tier.get(k)) for k in ("max_abs_err", "greedy_agreement", "kl", "ppl_change"))
        checks = [f"max |logit error| {err:.2g}" if err is not None else "",
                  f"greedy tokens agree {100 * agree:.1f}%" if agree is not None else "",
                  f"KL {kl:.3g}" if kl is not None else "", f"perplexity {100 * ppl:+.2f}%" if ppl is not None else ""]
        if any(checks):
            lines.append(f"  correct ({tier['tier']} tier, against the trusted reference): "
                         + ", ".join(c for c in checks if c))
    if "traffic" in v:
        lines.append(f"  timed on {v['model']} ({v['device']}) for traffic {v['traffic']}: the shapes below, each "
                     "weighted by its share of the traffic's cost")
    if v.get("gpu_s_per_1k_requests") is not None:
        lines.append(f"  projected device-s / 1k requests: {v['gpu_s_per_1k_requests']:.2f} "
                     f"(incumbent {v['incumbent_gpu_s_per_1k_requests']:.2f})")
    for tier in v["tiers"]:
        noise = tier["noise"]
        if noise.get("median") is not None:
            lines.append(f"  {tier['tier']} tier ({tier['num_layers']} layers): A/A [{noise['ci_low']:.3f}, "
                         f"{noise['ci_high']:.3f}]")
        for m in tier["measurements"]:
            lines.append(f"    {m['kind']:7s} B={m['batch_size']:<3d} ctx={m['context_len']:<5d} "
                         f"{1e3 * m['candidate_s']:.3f} ms vs {1e3 * m['incumbent_s']:.3f} ms  "
                         f"x{m['speedup']['median']:.3f}  weight {m['weight']:.2f}")
    lines.append(f"  compile {v['compile_s']:.2f}s, evaluation {v['wall_s']:.1f}s; torch {v['versions']['torch']}, "
                 f"triton {v['versions']['triton'] or '-'}")
    return "\n".join(lines)
