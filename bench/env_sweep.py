"""Settings read at graph capture, each against the MoE best-known options, in one process (issue 7).

The model is loaded and its routing replayed once; then the best-known candidate and a candidate (`--candidate`: the
persistent MoE block, `routing=triton_moe_block`, or the best-known itself) are timed alternately through the
engine's captured path (`bench_decode`, batch 1), the candidate under each value of an environment variable in turn
(`--var`: ATHANOR_MOE_BLOCK, the block's config, `athanor.kernels.moe_block.MoeBlockConfig`; or e.g.
ATHANOR_ROUTE_CHUNK), and last the fastest value and the best-known alternately again, since the fastest of several
timings is flattered by its noise. The empty value is the variable unset; a value may set more variables after
a space ("max ATHANOR_ROUTE_WARPS=1").

    python bench/env_sweep.py --model qwen3-30b-a3b [--routing FILE] [--configs "per_sm=3;rank_chunk=0"]
                                    [--candidate block|best] [--set OPTION=VALUE ...] [--var ATHANOR_MOE_BLOCK]
                                    [--budget 240]

`--set` changes options of the candidate (`--set lm_head=triton_greedy --var ATHANOR_GREEDY_TAIL`).

Writes $OUT/sweep_<var>_<model>.json (every timing, the block's grids) and prints a table last.
"""

from __future__ import annotations

import argparse
import gc
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from _record import result_path, write

CONFIGS = ("", "per_sm=3", "rank_chunk=0", "block_n3=16", "block_k2=1024")
"""ATHANOR_MOE_BLOCK values tried after the default ("")."""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="qwen3-30b-a3b")
    parser.add_argument("--context", type=int, default=1024)
    parser.add_argument("--routing", default=None, help="a recorded routing profile to replay")
    parser.add_argument("--configs", default=";".join(CONFIGS[1:]), help="';'-separated ATHANOR_MOE_BLOCK values")
    parser.add_argument("--budget", type=float, default=240.0, help="seconds of config timings before the check")
    parser.add_argument("--candidate", choices=("block", "best"), default="block")
    parser.add_argument("--var", default="ATHANOR_MOE_BLOCK", help="the environment variable the configs set")
    parser.add_argument("--set", action="append", default=[], metavar="OPTION=VALUE",
                        help="an option of the candidate changed (VALUE a Python literal, else a string)")
    args = parser.parse_args()

    import torch

    from athanor.kernels.moe_block import _RESIDENT
    from athanor.model.presets import PRESETS
    from athanor.moves import best_options, parse_settings, render
    from athanor.moves.decode_bench import bench_decode
    from decode_matrix import load_or_say

    loaded = load_or_say(args.model, args.routing)
    if loaded is None:
        return 1
    model, profile = loaded
    timings: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="athanor-moe-block-") as tmp:
        files = {}
        for name, routing in (("best", None), ("block", "triton_moe_block")):
            options = best_options(PRESETS[args.model])
            if routing:
                options["routing"] = routing
            files[name] = Path(tmp) / f"{name}.py"
            files[name].write_text(render("fast", options))
            if name == args.candidate and args.set:
                options.update(parse_settings(args.set))
                files["changed"] = Path(tmp) / "changed.py"
                files["changed"].write_text(render("fast", options))
        candidate = "changed" if args.set else args.candidate

        also: set[str] = set()  # the other variables configs have set ("max ATHANOR_ROUTE_WARPS=1")

        def step_ms(name: str, config: str = "") -> float:
            value, *others = config.split(" ")  # "VALUE OTHER=V ...": more variables set with this one
            settings = dict(item.split("=", 1) for item in others)
            for var in (args.var, *also):  # each timing under its own config's variables only
                os.environ.pop(var, None)
            also.update(settings)
            if value:
                os.environ[args.var] = value
            os.environ.update(settings)
            gc.collect()
            torch.cuda.empty_cache()
            record = bench_decode(args.model, 1, args.context, candidate=str(files[name]), routing=args.routing,
                                  model=model, profile=profile, iters=10, min_time_s=0.5)
            label = name + (f" [{config}]" if config else "")
            if record["status"] != "ok":
                print(f"{label}: {record.get('error', record['status'])}", flush=True)
                timings.append({"label": label, "config": config, "error": record.get("error", record["status"])})
                return float("inf")
            ms = float(record["ms_per_token"])
            timings.append({"label": label, "config": config, "ms_per_token": ms})
            print(f"{label}: {ms:.4f} ms", flush=True)
            return ms

        results: dict[str, float] = {}
        for _ in range(2):
            step_ms("best")
            results[""] = min(results.get("", float("inf")), step_ms(candidate))
        t0 = time.perf_counter()
        for config in filter(None, args.configs.split(";")):
            if time.perf_counter() - t0 > args.budget:
                print(f"budget spent: {config!r} not timed", flush=True)
                break
            results[config] = step_ms(candidate, config)
        fastest = min(results, key=lambda c: results[c])
        check: dict[str, list[float]] = {"best": [], "candidate": []}
        for _ in range(2 if len(results) > 1 else 0):  # with no config but the default, its pairs are the check
            check["best"].append(step_ms("best"))
            check["candidate"].append(step_ms(candidate, fastest))

    result = {"model": args.model, "context": args.context, "routing": args.routing, "candidate": args.candidate,
              "set": args.set, "var": args.var,
              "timings": timings, "fastest_config": fastest,
              "check": check, "resident_per_sm": [[list(map(str, key)), n] for key, n in _RESIDENT.items()]}
    write(result, result_path(f"sweep_{args.var.lower()}_{args.model}.json"))
    print(f"\n{'candidate':<48} {'ms/token':>9}")
    for t in timings:
        print(f"{t['label']:<48} {t.get('ms_per_token', float('nan')):>9.4f}")
    print(f"check: best {check['best']}, {candidate} [{args.var}={fastest}] {check['candidate']} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
