"""Tune the pinned kernel configs of a model's batch-1 decode inside the whole captured step (issue 7).

Triton's autotuner times each config of a kernel alone; in the step the kernel waits on the one before it and
shares the SMs with the next one's resident programs (PDL), and the autotuner's picks moved the same code by up to
13% (`athanor.kernels.jit.pinned`). Here each config the autotuner offers is pinned in turn for one shape of the
step and the whole step is timed through the engine's captured path (`bench_decode`): one shape at a time, each
left at its fastest config before the next (coordinate descent, one pass). Then the starting pins and the tuned
ones are timed alternately, twice each, since the fastest of a dozen timings is flattered by its noise.

    python bench/step_tune.py --model qwen3-30b-a3b [--set routing=triton_o_epilogue ...] [--routing FILE]
                              [--kernels expert_gemv_kernel,...] [--where BLOCK_K=1024 ...] [--budget 400]

Writes $OUT/step_tune_<model>.json (every timing, the pins before and after) and prints the tuned pins as
`jit/pinned.py` table lines.
"""

from __future__ import annotations

import argparse
import gc
import tempfile
import time
from pathlib import Path
from typing import Any

from _record import result_path, write

ORDER = ("expert_gemv_kernel", "fused_gemv_router_kernel", "fused_gemv_kernel", "fused_gemv_rope_kernel")
"""The kernels in the order they are tuned: the largest shares of a MoE step first."""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--context", type=int, default=1024)
    parser.add_argument("--set", action="append", default=[], metavar="OPTION=VALUE",
                        help="a best-known option changed (repeatable; VALUE a Python literal, else a string)")
    parser.add_argument("--routing", default=None, help="a recorded routing profile to replay (MoE)")
    parser.add_argument("--kernels", default=",".join(ORDER), help="the kernels whose shapes are tuned")
    parser.add_argument("--where", action="append", default=[], metavar="META=VALUE",
                        help="time only the configs with this meta-parameter (BLOCK_K=1024, say; repeatable)")
    parser.add_argument("--budget", type=float, default=400.0, help="seconds of config timings before the check")
    args = parser.parse_args()

    import torch

    from athanor.kernels.jit import pinned
    from athanor.model.presets import PRESETS
    from athanor.moves import best_options, parse_settings, render
    from athanor.moves.decode_bench import bench_decode
    from decode_matrix import load_or_say

    options = best_options(PRESETS[args.model])
    options.update(parse_settings(args.set))
    loaded = load_or_say(args.model, args.routing)
    if loaded is None:
        return 1
    model, profile = loaded
    table = pinned.PINNED.setdefault(pinned.gpu_name(torch.cuda.current_device()), {})
    timings: list[dict[str, Any]] = []

    with tempfile.TemporaryDirectory(prefix="athanor-step-tune-") as tmp:
        candidate = Path(tmp) / "candidate.py"
        candidate.write_text(render("fast", options))

        def step_ms(label: str) -> float:
            gc.collect()
            torch.cuda.empty_cache()
            record = bench_decode(args.model, 1, args.context, candidate=str(candidate), routing=args.routing,
                                  model=model, profile=profile, iters=10, min_time_s=0.5)
            if record["status"] != "ok":
                raise RuntimeError(f"{label}: {record.get('error', record['status'])}")
            timings.append({"label": label, "ms_per_token": record["ms_per_token"]})
            print(f"{label}: {record['ms_per_token']:.4f} ms", flush=True)
            return float(record["ms_per_token"])

        pinned.LAUNCHED.clear()
        current = step_ms("start")
        started = {name: dict(pins) for name, pins in table.items()}
        wanted = args.kernels.split(",")
        shapes = sorted((k for k in pinned.LAUNCHED if k[0] in wanted), key=lambda k: (wanted.index(k[0]), k[1]))
        where = [item.split("=", 1) for item in args.where]
        t0 = time.perf_counter()
        for name, key in shapes:
            tuned = pinned.LAUNCHED[name, key]
            best = table.get(name, {}).get(key)
            for config in tuned.configs:
                if time.perf_counter() - t0 > args.budget:
                    break
                if any(str(config.kwargs.get(meta)) != value for meta, value in where):
                    continue
                pin = (dict(config.kwargs), config.num_warps, config.num_stages)
                if pin == best:
                    continue
                table.setdefault(name, {})[key] = pin
                ms = step_ms(f"{name} {key} {pin}")
                if ms < current:
                    current, best = ms, pin
            if best is None:
                table.get(name, {}).pop(key, None)
            else:
                table[name][key] = best
        tuned_pins = {name: dict(pins) for name, pins in table.items()}
        check: dict[str, list[float]] = {"start": [], "tuned": []}
        for _ in range(2):
            for label, pins in (("start", started), ("tuned", tuned_pins)):
                table.clear()
                table.update({name: dict(p) for name, p in pins.items()})
                check[label].append(step_ms(f"check {label}"))

    changed = {name: {str(key): pin for key, pin in pins.items() if started.get(name, {}).get(key) != pin}
               for name, pins in tuned_pins.items()}
    result = {"model": args.model, "context": args.context, "options": options, "routing": args.routing,
              "shapes": [[name, list(key)] for name, key in shapes], "timings": timings, "check": check,
              "changed_pins": {name: pins for name, pins in changed.items() if pins}}
    write(result, result_path(f"step_tune_{args.model}.json"))
    print(f"check: start {check['start']}, tuned {check['tuned']} ms")
    for name, pins in result["changed_pins"].items():
        for key, pin in pins.items():
            print(f"{name}: {key}: {pin}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
