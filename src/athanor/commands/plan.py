"""`athanor plan`: the parallel layouts of a model on N GPUs, ranked for a traffic (`athanor.plan`)."""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("plan", help="rank the parallel layouts (TP, EP, DCP, PP, DP) of a model on N GPUs for a "
                                    "traffic, by GPU-seconds per 1,000 requests and by latency")
    p.add_argument("--model", required=True, help="a model name, preset or HF directory")
    p.add_argument("--traffic", default="preset:chat", help="a trace file, a saved profile or preset:chat|code|agent")
    p.add_argument("--gpus", type=int, required=True, help="GPUs of one machine to lay the model over")
    p.add_argument("--gpu", default="h200", help="the GPU: h200, h100, a100, or a JSON file of "
                                                 "athanor.plan.hardware.Hardware's fields")
    p.add_argument("--concurrency", default="1,8,32,64,128,256", help="sequences in flight to rank layouts at "
                                                                     "(comma-separated)")
    p.add_argument("--calibrate", nargs="+", default=[], metavar="RECORD", help="athanor bench decode records of "
                   "this model measured on this GPU: the decode term is scaled to fit them")
    p.add_argument("--top", type=int, default=5, help="layouts shown per concurrency")
    p.add_argument("--json", default="", help="also write the whole plan (every layout, every level) here")
    p.set_defaults(func=cmd_plan)


def cmd_plan(args: argparse.Namespace) -> int:
    import json
    from pathlib import Path

    from athanor.errors import ConfigError
    from athanor.model.registry import load_spec
    from athanor.plan import calibrate, make_plan, render
    from athanor.plan.hardware import load_hardware
    from athanor.traffic import load_profile

    try:
        levels = tuple(int(c) for c in args.concurrency.split(",") if c.strip())
    except ValueError:
        raise ConfigError(f"--concurrency {args.concurrency}: give whole numbers separated by commas") from None
    if not levels or min(levels) < 1:
        raise ConfigError(f"--concurrency {args.concurrency}: give one or more levels of at least 1")
    spec = load_spec(args.model)
    hw = load_hardware(args.gpu)
    calibration = calibrate(spec, hw, args.calibrate) if args.calibrate else None
    plan = make_plan(spec, hw, args.gpus, load_profile(args.traffic), levels, calibration)
    print(render(plan, args.top))
    if args.json:
        Path(args.json).write_text(json.dumps(plan.to_dict(), indent=1) + "\n")
        print(f"wrote {args.json}")
    return 0
