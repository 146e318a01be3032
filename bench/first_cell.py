"""Why a process's first decode cell reads slower than its next ones (issue 7): a probe for one device call.

The same best-known qwen3-30b-a3b step read 2.438-2.448 ms in a process's first cell and 2.387-2.396 in its next ones,
and 2.444 through the CLI, a process each; more timings of the same captured step read the same, so it was a state of
the cell, not a transient, carried by the attention's kernels (the split kernel 200 against 131 us a step on the
critical path). This probe found it in the graphs, not the memory (`bench/README.md`, "The first cell of a process"):
since e250d04 the engine captures a process's first graphs twice, and the first cell reads as the next ones.

This process loads the model once and times `--cells` cells of a candidate one after another, each profiled (the
attention kernels' microseconds a step printed, the split kernel's addresses in the record). What may set the first
cell apart, each an option: the copy bandwidth's measurement (2 x 2 GiB allocated, copied, freed and the allocator's
cache emptied: inside a process's first cell) moved before the model loads (`--bandwidth-first`); the allocator's
cache emptied before the first cell (`--empty-cache`); `--prealloc-mb N` allocated and freed after the bandwidth
(kept cached: the first cell's buffers are carved from it, as a second cell's come from what the first freed); the
graphs captured twice in each cell, the second timed (`--recapture`); a cell of another model first (`--before`).

    python bench/first_cell.py [--model qwen3-30b-a3b] [--routing FILE] [--cells 2] [--candidate best|FILE]
        [--bandwidth-first] [--empty-cache] [--prealloc-mb N] [--recapture] [--before MODEL]

Writes $OUT/first_cell_<model>_<options>.json (every cell's record).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from _record import result_path, write

WATCHED = ("decode_attention_split_kernel", "decode_attention_merge_kernel", "fused_gemv_router_kernel")
SPLIT_ARGS = ("q", "k_cache", "v_cache", "slots", "kv_lens", "o_part", "lse_part", "out")


def log_split_pointers(launches: list[dict[str, int]]) -> None:
    """Record the device addresses the split-KV attention kernel is launched with (each launch's tensors) into
    `launches`: whether a slow cell's attention reads and writes elsewhere than a fast one's."""
    import athanor.kernels.jit.attention as jit_attention

    kernel = jit_attention.decode_attention_split_kernel

    class Logged:
        def __getitem__(self, grid):  # type: ignore[no-untyped-def]
            launch = kernel[grid]

            def run(*args, **kwargs):  # type: ignore[no-untyped-def]
                launches.append({name: args[i].data_ptr() for i, name in enumerate(SPLIT_ARGS)})
                return launch(*args, **kwargs)
            return run

    jit_attention.decode_attention_split_kernel = Logged()


def pointers(launches: list[dict[str, int]], layers: int) -> dict[str, object]:
    """The captured step's (the last `layers` launches) addresses: layer 0's, and per tensor how many distinct
    addresses and their offsets within 2 MiB pages."""
    captured = launches[-layers:]
    out: dict[str, object] = {"layer0": {k: hex(v) for k, v in captured[0].items()}}
    for name in SPLIT_ARGS:
        ptrs = [c[name] for c in captured]
        out[name] = {"distinct": len(set(ptrs)), "offsets_2mb": sorted({hex(p % (2 << 20)) for p in ptrs})[:6]}
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="qwen3-30b-a3b")
    parser.add_argument("--routing", default=None, help="a recorded routing profile to replay (MoE)")
    parser.add_argument("--prealloc-mb", type=int, default=0, help="MB allocated and freed (kept cached) first")
    parser.add_argument("--bandwidth-first", action="store_true",
                        help="measure the copy bandwidth (2 x 2 GiB allocated, copied, freed, the cache emptied) "
                             "before the model loads, not inside the first cell")
    parser.add_argument("--empty-cache", action="store_true", help="empty the allocator's cache before the first cell")
    parser.add_argument("--candidate", default="best", help="'best' or a candidate file")
    parser.add_argument("--recapture", action="store_true",
                        help="every cell captures its graphs, drops them and captures again (times the second)")
    parser.add_argument("--before", default=None, help="a model (e.g. tiny-moe) one cell of which runs first")
    parser.add_argument("--cells", type=int, default=2)
    args = parser.parse_args()

    import torch

    from athanor.moves.decode_bench import bench_decode, copy_bandwidth
    from decode_matrix import load_or_say

    if args.recapture:
        from athanor.engine.graphs import DecodeRunner

        capture = DecodeRunner.capture

        def twice(self: DecodeRunner) -> None:
            capture(self)
            self._graphs.clear()
            self._pool = None
            capture(self)

        DecodeRunner.capture = twice  # type: ignore[method-assign]
    if args.before:
        first = bench_decode(args.before, 1, 1024, candidate="best")
        print(f"{args.before} first: {first.get('ms_per_token', float('nan')):.4f} ms", flush=True)
    if args.bandwidth_first:
        copy_bandwidth(torch.device("cuda"))  # cached for the process: the cells do not measure it again
    loaded = load_or_say(args.model, args.routing)
    if loaded is None:
        return 1
    model, profile = loaded
    if args.empty_cache:
        torch.cuda.empty_cache()
    if args.prealloc_mb:
        copy_bandwidth(torch.device("cuda"))  # its emptying of the cache would release the block again
        block = torch.empty(args.prealloc_mb << 20, dtype=torch.uint8, device="cuda")
        del block  # back to the allocator's cache, not to the driver: the cells' first buffers reuse it
    label = "_".join(str(x) for x in (args.prealloc_mb, "bw" * args.bandwidth_first, "empty" * args.empty_cache,
                                      "recapture" * args.recapture, args.before or "",
                                      Path(args.candidate).stem) if x != "")
    launches: list[dict[str, int]] = []
    log_split_pointers(launches)
    records = []
    for cell in range(args.cells):
        launches.clear()
        record = bench_decode(args.model, 1, 1024, candidate=args.candidate, routing=args.routing, model=model,
                              profile=profile, kernels=True)
        if launches:
            record["split_pointers"] = pointers(launches, model.spec.num_layers)
        records.append(record)
        us = {k["name"]: round(k["us_per_step"], 1) for k in record.get("kernels", []) if k["name"] in WATCHED}
        print(f"{label}: prealloc {args.prealloc_mb} MB, cell {cell + 1}: {record.get('ms_per_token', float('nan')):.4f} ms; "
              f"us a step: {us}", flush=True)
    write({"model": args.model, "prealloc_mb": args.prealloc_mb, "bandwidth_first": args.bandwidth_first,
           "empty_cache": args.empty_cache,
           "recapture": args.recapture, "before": args.before, "candidate": args.candidate, "cells": records},
          result_path(f"first_cell_{args.model}_{label}.json"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
