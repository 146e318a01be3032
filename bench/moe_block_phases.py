"""Where the persistent MoE block's time goes, phase by phase (issue 7): qwen3-30b-a3b's block shapes (O 4096 -> 2048,
128 experts, top 8, 2048 -> 768 -> 2048) at one row, random bf16 weights, replayed from a CUDA graph.

For each ATHANOR_MOE_BLOCK config: the block's time per call, and from each program's clock stamps (`moe_block(...,
stamps=)`, the kernel's TIMING) the median and the latest program's time at the end of phase 1 (the O projection),
once the routing is known, at the end of phase 2 (gate/up), after the barrier and at the end (down), from the
earliest program's start; whether its output is the four launches' it stands for (`linear_route` and two
`expert_gemv` calls: h and the ids the same, the output within bf16 rounding) and no program gave up waiting; then
the four launches' time in a graph of their own.

    python bench/moe_block_phases.py [--configs ";per_sm=3;split_k1=1"]

Writes $OUT/moe_block_phases.json and prints a table last.
"""

from __future__ import annotations

import argparse
import json
import os
from typing import Any

import torch

from _record import result_path, write

SLOTS = ("O", "routed", "gate/up", "barrier", "down")
"""What ends at each stamp after the start (`jit.moe_block`'s TIMING)."""


def _graph_us(fn: Any, iters: int = 20) -> tuple[float, torch.cuda.CUDAGraph]:
    fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    graph.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        graph.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / iters * 1e3, graph


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--configs", default=";per_sm=3;rank_chunk=0")
    args = parser.parse_args()

    from athanor.kernels import linear_route, moe_block, routed_experts
    from athanor.kernels.dispatch import _zeroed

    torch.manual_seed(0)
    bf = {"device": "cuda", "dtype": torch.bfloat16}
    e, top_k, hidden, k, inter = 128, 8, 2048, 4096, 768
    x, wo, residual = torch.randn(1, k, **bf), torch.randn(hidden, k, **bf) / 64, torch.randn(1, hidden, **bf)
    router_w, nw = torch.randn(e, hidden, **bf) / hidden**0.5, torch.randn(hidden, **bf)
    w_gate, w_up = (torch.randn(e, inter, hidden, **bf) / hidden**0.5 for _ in range(2))
    w_down = torch.randn(e, hidden, inter, **bf) / inter**0.5
    call = (x, wo, residual, router_w, nw, 1e-6, top_k, "softmax", True, None, w_gate, w_up, w_down)
    stamps = torch.zeros(4096, 8, dtype=torch.int64, device="cuda")

    def four() -> tuple[torch.Tensor, ...]:
        h, _, ids, weights = linear_route(*call[:10])
        return routed_experts(h, w_gate, w_up, w_down, ids, weights, nw, 1e-6), h, ids

    ref_out, ref_h, ref_ids = four()

    rows: list[dict[str, Any]] = []
    for config in args.configs.split(";"):
        os.environ["ATHANOR_MOE_BLOCK"] = config
        block = moe_block(*call)
        same = {"h": bool(torch.equal(block.h, ref_h)), "ids": bool(torch.equal(block.ids, ref_ids)),
                "out_rel_err": float((block.out.double() - ref_out.double()).norm() / ref_out.double().norm()),
                "gave_up": int(_zeroed("moe_block_barrier", torch.device("cuda"), 4, torch.int32)[2])}
        us, _ = _graph_us(lambda: moe_block(*call))
        stamps.zero_()
        _, graph = _graph_us(lambda: moe_block(*call, stamps=stamps), iters=3)
        graph.replay()
        torch.cuda.synchronize()
        t = stamps[stamps[:, 0] > 0].double()
        rel = (t[:, 1:6] - t[:, :1].min()) / 1e3
        row = {"config": config or "(default)", "us": us, "programs": int(t.shape[0]), **same,
               "median_us": [round(float(v), 2) for v in rel.median(0).values],
               "latest_us": [round(float(v), 2) for v in rel.max(0).values]}
        rows.append(row)
        print(json.dumps(row), flush=True)
    us_four, _ = _graph_us(four)
    write({"slots": SLOTS, "rows": rows, "four_launches_us": us_four}, result_path("moe_block_phases.json"))
    print(f"\nthe four launches: {us_four:.1f} us a call; the block, each phase's end from the first start "
          "(median / latest program), us:")
    print(f"{'config':<28} {'us':>6} {'P':>4} " + " ".join(f"{s:>13}" for s in SLOTS))
    for row in rows:
        ends = " ".join(f"{m:>6.1f}/{x:<6.1f}" for m, x in zip(row["median_us"], row["latest_us"], strict=True))
        print(f"{row['config']:<28} {row['us']:>6.1f} {row['programs']:>4} {ends}  h/ids same {row['h']}/{row['ids']}, "
              f"out err {row['out_rel_err']:.4f}, gave up {row['gave_up']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
