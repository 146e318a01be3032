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
                   "this model measured on this GPU (the decode term is fitted to them) and athanor bench collectives "
                   "records (their link replaces the GPU's)")
    p.add_argument("--fit-batch", default="", help="fit only on the records' cells of these batches (comma-separated)")
    p.add_argument("--fit-context", default="", help="fit only on the records' cells of these contexts")
    p.add_argument("--check", action="store_true", help="with --calibrate: every cell of the records beside the "
                   "specification's prediction and the fitted one, and the errors on the cells not fitted on")
    p.add_argument("--routing", default="", help="MoE: a RoutingProfile JSON (athanor traffic routing): experts read "
                   "per step as it activates them (default: uniform routing, an upper bound)")
    p.add_argument("--top", type=int, default=5, help="layouts shown per concurrency")
    p.add_argument("--json", default="", help="also write the whole plan (every layout, every level) here")
    p.set_defaults(func=cmd_plan)


def _ints(flag: str, text: str) -> tuple[int, ...]:
    from athanor.errors import ConfigError
    try:
        return tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise ConfigError(f"{flag} {text}: give whole numbers separated by commas") from None


def cmd_plan(args: argparse.Namespace) -> int:
    import dataclasses
    import json
    from pathlib import Path

    from athanor.errors import ConfigError
    from athanor.model.registry import load_spec
    from athanor.plan import make_plan, render
    from athanor.plan.calibration import calibrate, check, read_records, render_check
    from athanor.plan.hardware import load_hardware
    from athanor.traffic import load_profile
    from athanor.traffic.routing import load_routing

    try:
        levels = tuple(int(c) for c in args.concurrency.split(",") if c.strip())
    except ValueError:
        raise ConfigError(f"--concurrency {args.concurrency}: give whole numbers separated by commas") from None
    if not levels or min(levels) < 1:
        raise ConfigError(f"--concurrency {args.concurrency}: give one or more levels of at least 1")
    batches, contexts = _ints("--fit-batch", args.fit_batch), _ints("--fit-context", args.fit_context)
    if args.check and not args.calibrate:
        raise ConfigError("--check: give the records to check against with --calibrate RECORD")
    spec = load_spec(args.model)
    hw = load_hardware(args.gpu)
    routing = load_routing(args.routing, spec) if args.routing else None
    records = read_records(spec, args.calibrate)
    calibration = calibrate(spec, hw, records, routing, batches, contexts) if args.calibrate else None
    plan = make_plan(spec, hw, args.gpus, load_profile(args.traffic), levels, calibration, routing)
    print(render(plan, args.top))
    if spec.moe is not None and routing is None:
        print("routing: uniform, an upper bound on the experts a step reads (--routing FILE for a measured profile)")
    out = plan.to_dict()
    if args.check:
        assert calibration is not None
        result = check(spec, hw, records, calibration, routing, batches, contexts)
        print("\n" + render_check(result))
        out["check"] = {"summary": result.summary(), "fit_batches": sorted(batches), "fit_contexts": sorted(contexts),
                        "cells": [dataclasses.asdict(r) for r in result.rows]}
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1) + "\n")
        print(f"wrote {args.json}")
    return 0
