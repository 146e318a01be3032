"""Which rows oneDNN should take on a CPU: gemv="onednn" (every linear layer) against "onednn_decode" (2-32 rows only,
MKL's sgemm for one row and for prefills), the whole model at the engine worker's thread count.

Both candidates (per-sequence attention, the rest the reference's) are built on one random-weight model and run
alternately: a prefill of ~384 fresh tokens, a decode step of 16 sequences at context 750 and one of a single
sequence, `--rounds` times. Reported per shape: each side's lower-quartile step time and the median of the per-round
ratios onednn / onednn_decode (above 1: onednn_decode faster). Also each linear shape alone at 1-384 rows.

    python bench/cpu_gemv_rows.py [--model smollm2-135m] [--threads 1] [--rounds 12] [--json FILE]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).parent))
from _record import write
from athanor.engine.candidate import Candidate, import_candidate
from athanor.kernels.onednn import onednn_linear, pack_weight
from athanor.model import BuildContext, DecodeBatch, make_prefill_batch
from athanor.model.registry import load_model
from athanor.moves import render

SIDES = ("onednn", "onednn_decode")


def _build(gemv: str, model: Any, ctx: BuildContext, scratch: Path) -> Any:
    candidate = Candidate.from_source(render("fast", {"attention": "torch_per_seq", "gemv": gemv}))
    return import_candidate(candidate, scratch / gemv, 0).build(model, ctx)


def _time(fn: Callable[..., object], *args: object) -> float:
    start = time.perf_counter()
    fn(*args)
    return time.perf_counter() - start


def _q1(values: list[float]) -> float:
    return sorted(values)[len(values) // 4]


def whole_model(model: Any, rounds: int) -> dict[str, Any]:
    spec = model.spec
    ctx = BuildContext(torch.device("cpu"), torch.float32, max_seqs=16, max_seq_len=1024)
    with tempfile.TemporaryDirectory() as scratch:
        fwds = {g: _build(g, model, ctx, Path(scratch)) for g in SIDES}
    gen = torch.Generator().manual_seed(0)
    pos = torch.full((16,), 750)
    decode16 = DecodeBatch(torch.randint(0, spec.vocab_size, (16,), generator=gen), pos, torch.arange(16), pos.clone())
    decode1 = DecodeBatch(decode16.tokens[:1], pos[:1], torch.arange(1), pos[:1].clone())
    times: dict[str, dict[str, list[float]]] = {s: {g: [] for g in SIDES} for s in ("prefill384", "decode16", "decode1")}
    with torch.no_grad():
        for r in range(rounds):
            prefill = make_prefill_batch([torch.randint(0, spec.vocab_size, (380 + r,), generator=gen).tolist()], [0])
            for g, fwd in fwds.items():
                times["prefill384"][g].append(_time(fwd.prefill, prefill))
                times["decode16"][g].append(_time(fwd.decode, decode16))
                times["decode1"][g].append(_time(fwd.decode, decode1))
    return {shape: {**{f"{g}_q1_s": _q1(t[g]) for g in SIDES},
                    "onednn_over_onednn_decode": statistics.median(a / b for a, b in zip(*t.values(), strict=True)),
                    "rounds": rounds}
            for shape, t in times.items()}


def per_shape(model: Any) -> list[dict[str, Any]]:
    h, spec = model.spec.hidden_size, model.spec
    shapes = {(spec.num_heads * spec.head_dim, h), (spec.num_kv_heads * spec.head_dim, h),
              (spec.intermediate_size, h), (h, spec.intermediate_size), (spec.vocab_size, h)}
    rows = []
    for n, k in sorted(shapes):
        w = torch.randn(n, k)
        packed = pack_weight(w)
        for m in (1, 16, 64, 128, 384):
            x = torch.randn(m, k)
            mkl = _q1([_time(F.linear, x, w) for _ in range(20)])
            dnnl = _q1([_time(onednn_linear, x, packed, None) for _ in range(20)])
            rows.append({"n": n, "k": k, "rows": m, "mkl_s": mkl, "onednn_s": dnnl, "onednn_speedup": mkl / dnnl})
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (an engine worker on 2 cores runs one)")
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--json", default="bench/results/cpu_gemv_rows.json")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    model = load_model(args.model, device="cpu", dtype=torch.float32)
    result = {"benchmark": "cpu_gemv_rows", "model": args.model, "threads": args.threads,
              "whole_model": whole_model(model, args.rounds), "per_shape": per_shape(model)}
    print(f"{'linear N x K':>14} " + " ".join(f"{m:>8}" for m in (1, 16, 64, 128, 384)) + "   (oneDNN speedup over MKL)")
    for i in range(0, len(result["per_shape"]), 5):
        group = result["per_shape"][i:i + 5]
        print(f"{group[0]['n']:>7} x {group[0]['k']:<5} " + " ".join(f"{g['onednn_speedup']:8.2f}" for g in group))
    for shape, r in result["whole_model"].items():
        print(f"{shape:>10}: onednn {r['onednn_q1_s'] * 1e3:8.1f} ms  onednn_decode {r['onednn_decode_q1_s'] * 1e3:8.1f} ms"
              f"  onednn / onednn_decode x{r['onednn_over_onednn_decode']:.3f}")
    print("->", write(result, args.json))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
