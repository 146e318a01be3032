"""`athanor traffic profile|drift|plot`: thin wrappers over `athanor.traffic`."""

from __future__ import annotations

import argparse
import json
from typing import Any

from athanor.errors import ConfigError
from athanor.traffic.formats import FORMATS


def register(subparsers: Any) -> None:
    p = subparsers.add_parser("traffic", help="profile request traces, detect drift, plot")
    sub = p.add_subparsers(dest="traffic_command", metavar="SUBCOMMAND")
    prof = sub.add_parser("profile", help="summarise a trace (or preset:NAME) as a TrafficProfile")
    prof.add_argument("file", help="trace file, saved profile .json, or preset:chat|code|agent")
    prof.add_argument("--window", help="also profile consecutive windows, e.g. 10m")
    prof.add_argument("--json", action="store_true", help="print the profile as JSON")
    prof.add_argument("--format", choices=FORMATS, help="trace format (default: detected from content)")
    prof.add_argument("--skip-bad", action="store_true", help="count and skip malformed rows instead of stopping")
    prof.add_argument("--tpot-ms", type=float, default=30.0, help="per-token latency for the implied decode batch")
    prof.set_defaults(func=_profile)
    drift = sub.add_parser("drift", help="compare two traces or profiles; exit 0 same, 1 drift, 2 error")
    drift.add_argument("a", help="reference: trace, saved profile .json or preset:NAME")
    drift.add_argument("b", help="current: trace, saved profile .json or preset:NAME")
    drift.add_argument("--json", action="store_true", help="print the report as JSON")
    drift.add_argument("--skip-bad", action="store_true", help="count and skip malformed rows")
    drift.set_defaults(func=_drift)
    plot = sub.add_parser("plot", help="draw length distributions and request rate over time")
    plot.add_argument("file", help="trace file, saved profile .json, or preset:chat|code|agent")
    plot.add_argument("-o", "--output", required=True, help="PNG to write")
    plot.add_argument("--format", choices=FORMATS)
    plot.add_argument("--skip-bad", action="store_true")
    plot.set_defaults(func=_plot)
    routing = sub.add_parser("routing", help="convert measured MoE routing into a RoutingProfile JSON (for "
                                             "--routing: replayed on random-weight models)")
    routing.add_argument("file", help="vLLM routed experts [tokens, layers, top_k] (.npy), an SGLang "
                                      "expert-distribution dump (.pt), or a per-layer selection table (.csv)")
    routing.add_argument("-o", "--output", required=True, help="RoutingProfile JSON to write")
    routing.add_argument("--top-k", type=int, help="experts per token (.pt, .csv)")
    routing.add_argument("--num-experts", type=int, help="experts per layer (.npy)")
    routing.add_argument("--where", action="append", default=[], metavar="COLUMN=VALUE",
                         help=".csv: keep the rows with this value (repeatable)")
    routing.set_defaults(func=_routing)
    p.set_defaults(func=lambda args: _usage(p))


def _usage(p: argparse.ArgumentParser) -> int:
    p.print_help()
    return 2


def _profile(args: argparse.Namespace) -> int:
    from athanor.traffic.profile import load_profile, parse_window

    window_s = parse_window(args.window) if args.window else None
    if args.tpot_ms <= 0:
        raise ConfigError(f"--tpot-ms {args.tpot_ms}: must be positive")
    kwargs: dict[str, Any] = {}
    if not args.file.startswith("preset:") and not args.file.endswith(".json"):
        kwargs = {"format": args.format, "skip_bad": args.skip_bad, "tpot_s": args.tpot_ms / 1000}
    prof = load_profile(args.file, window_s=window_s, **kwargs)
    print(prof.to_json(indent=1) if args.json else prof.summary())
    return 0


def _drift(args: argparse.Namespace) -> int:
    from athanor.traffic.drift import compare_profiles
    from athanor.traffic.profile import load_profile

    def load(spec: str) -> Any:
        kw = {} if spec.startswith("preset:") or spec.endswith(".json") else {"skip_bad": args.skip_bad}
        return load_profile(spec, **kw)

    report = compare_profiles(load(args.a), load(args.b))
    print(json.dumps(report.to_dict(), indent=2) if args.json else report.summary())
    return 1 if report.drifted else 0


def _plot(args: argparse.Namespace) -> int:
    from athanor.traffic.plot import plot_trace

    plot_trace(args.file, args.output, format=args.format, skip_bad=args.skip_bad)
    print(f"wrote {args.output}")
    return 0


def _routing(args: argparse.Namespace) -> int:
    from pathlib import Path

    from athanor.traffic.routing import load_selection_table, load_sglang_dump, load_vllm_routed_experts

    suffix = Path(args.file).suffix
    if not Path(args.file).is_file():
        raise ConfigError(f"{args.file}: no such file")
    needs = {".npy": "num_experts", ".pt": "top_k", ".csv": "top_k"}.get(suffix)
    if needs is None:
        raise ConfigError(f"{args.file}: unknown routing format {suffix!r}: use .npy (vLLM), .pt (SGLang) or .csv")
    if getattr(args, needs) is None or getattr(args, needs) < 1:
        raise ConfigError(f"{args.file}: a {suffix} file needs --{needs.replace('_', '-')} (a positive integer)")
    where = dict(w.split("=", 1) for w in args.where if "=" in w)
    if len(where) != len(args.where):
        raise ConfigError(f"--where {args.where}: each must be COLUMN=VALUE")
    if suffix == ".npy":
        profile = load_vllm_routed_experts(args.file, args.num_experts)
    elif suffix == ".pt":
        profile = load_sglang_dump(args.file, args.top_k)
    else:
        profile = load_selection_table(args.file, args.top_k, where)
    out = Path(args.output)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(profile.to_dict()))
    except OSError as e:
        raise ConfigError(f"-o {out}: cannot write the profile ({e.strerror})") from None
    hottest = max(max(layer) for layer in profile.load) * profile.num_experts
    print(f"{profile.source}: {profile.num_layers} layers x {profile.num_experts} experts, top-{profile.top_k}; "
          f"hottest expert {hottest:.1f}x its even share; wrote {args.output}")
    return 0
