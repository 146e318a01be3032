"""Why qwen3-30b-a3b's decode step broke the CUDA context with the O projection's routing tail (issue 7).

The tail's GPU tests pass (bit for bit the routing kernel's, with and without a selection bias), yet the best-known
step hit an illegal address. This builds that step (batch 1, context 1024, the recorded routing) with every launch
synchronous (CUDA_LAUNCH_BLOCKING=1), checks each eager `linear_route` call's results on the host (h finite, the ids
distinct experts in range), prints the first that is not, and prints the traceback of any failure instead of exiting.

    CUDA_LAUNCH_BLOCKING=1 python bench/route_tail_check.py [--routing FILE] [--tail 1]
"""

from __future__ import annotations

import argparse
import os
import traceback


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--routing", default=None)
    parser.add_argument("--tail", default="1")
    args = parser.parse_args()
    os.environ["ATHANOR_ROUTE_TAIL"] = args.tail

    import torch

    import athanor.engine.core as core
    import athanor.kernels as kernels
    from athanor.moves.decode_bench import bench_decode
    from decode_matrix import load_or_say

    core.exit_if_device_broken = lambda e: None  # the traceback in the swap's reply instead
    plain = kernels.linear_route
    seen = {"calls": 0, "bad": 0}

    def checked(*a, **kw):  # type: ignore[no-untyped-def]
        out = plain(*a, **kw)
        if torch.cuda.is_current_stream_capturing():
            return out
        seen["calls"] += 1
        h, logits, ids, weights = out
        e = a[3].shape[0]
        torch.cuda.synchronize()
        ok = bool(torch.isfinite(h).all()) and bool(((ids >= 0) & (ids < e)).all()) and all(
            row.unique().numel() == row.numel() for row in ids)
        if not ok and seen["bad"] < 3:
            seen["bad"] += 1
            print(f"call {seen['calls']}: x finite {bool(torch.isfinite(a[0]).all())}, h finite "
                  f"{bool(torch.isfinite(h).all())}, logits {logits.float().flatten()[:6].tolist()}, "
                  f"ids {ids.tolist()}, weights {weights.tolist()}", flush=True)
        return out

    kernels.linear_route = checked
    loaded = load_or_say("qwen3-30b-a3b", args.routing)
    if loaded is None:
        return 1
    model, profile = loaded
    try:
        record = bench_decode("qwen3-30b-a3b", 1, 1024, candidate="best", routing=args.routing, model=model,
                              profile=profile, iters=10, min_time_s=0.2)
        print(record.get("status"), record.get("ms_per_token"), str(record.get("error", ""))[-3000:])
    except Exception:
        traceback.print_exc()
    print(f"linear_route eager calls checked: {seen['calls']}, bad: {seen['bad']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
