"""`athanor bench <what>`: benchmarks that write a JSON record (device, versions, commit).

Sub-commands register under one `bench` parser; `swap` is the engine's. Others (`decode`,
`serve`) add theirs through `add_bench_command`.
"""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path

log = logging.getLogger(__name__)


def register(sub: argparse._SubParsersAction) -> None:
    bench = sub.add_parser("bench", help="run a benchmark and write its JSON record")
    bench_sub = bench.add_subparsers(dest="bench_command", metavar="BENCHMARK", parser_class=type(bench))
    bench.set_defaults(func=lambda args: (bench.print_help(), 2)[1])
    # Others find the sub-parser set here to add `bench decode`, `bench serve`, ...
    bench.set_defaults(bench_subparsers=bench_sub)

    p = bench_sub.add_parser("swap", help="cold start, swap, experiment and respawn times of the engine")
    p.add_argument("--model", default="smollm2-135m", help="name, preset, HF directory or .gguf file")
    p.add_argument("--device", default="cpu", help="cpu or cuda[:N]")
    p.add_argument("--dtype", default="", help="float32, bfloat16, ... (default: as stored)")
    p.add_argument("--swaps", type=int, default=10, help="swaps between two candidates (the median is reported)")
    p.add_argument("--max-seqs", type=int, default=8)
    p.add_argument("--max-seq-len", type=int, default=256)
    p.add_argument("--threads", type=int, default=0, help="CPU threads of the worker (0: torch's default)")
    p.add_argument("--compile", action="store_true", help="also time a torch.compile candidate's swap, cold and warm")
    p.add_argument("--json", required=True, help="where to write the record")
    p.set_defaults(func=cmd_swap)

    d = bench_sub.add_parser("decode", help="per-token decode time through the engine's captured path, "
                                            "and its share of the HBM roofline")
    d.add_argument("--model", required=True, help="preset (random weights), random:PRESET[@SEED], HF dir or .gguf")
    d.add_argument("--batch", type=int, default=1)
    d.add_argument("--context", type=int, default=1024, help="tokens already cached per row")
    d.add_argument("--candidate", default="reference", help="a candidate file, 'reference' or 'best' (best-known)")
    d.add_argument("--compile", action="store_true", help="torch.compile the step (the reference: its "
                                                          "computation in the template, compiled)")
    d.add_argument("--device", default="cuda")
    d.add_argument("--dtype", default="bfloat16")
    d.add_argument("--iters", type=int, default=50, help="at least this many timed steps")
    d.add_argument("--routing", default="", help="MoE: a RoutingProfile JSON to replay (default: Zipf-parametric)")
    d.add_argument("--windows", type=int, default=0, help="time the step this many times more (into window_ms): "
                                                          "a steady state or a transient")
    d.add_argument("--json", required=True, help="where to write the record")
    d.set_defaults(func=cmd_decode)


def cmd_swap(args: argparse.Namespace) -> int:
    from athanor.engine.bench import bench_swap
    from athanor.errors import ConfigError

    if args.swaps < 1:
        raise ConfigError("--swaps must be at least 1")
    record = bench_swap(args.model, device=args.device, dtype=args.dtype, num_swaps=args.swaps,
                        max_seqs=args.max_seqs, max_seq_len=args.max_seq_len, cpu_threads=args.threads,
                        with_compile=args.compile)
    out = Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record, indent=2) + "\n")
    keys = ("cold_start_s", "swap_s", "experiment_s", "respawn_s", "compile_swap_first_s", "compile_swap_warm_s")
    summary = "  ".join(f"{k}={record[k]:.3f}" for k in keys if k in record)
    print(f"{args.model} on {record['device_name']}: {summary}  -> {out}")
    return 0


def cmd_decode(args: argparse.Namespace) -> int:
    from athanor.moves.decode_bench import bench_decode

    record = bench_decode(args.model, args.batch, args.context, candidate=args.candidate, use_compile=args.compile,
                          device=args.device, dtype=args.dtype, iters=args.iters, routing=args.routing or None,
                          windows=args.windows)
    out = Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record, indent=2) + "\n")
    if record["status"] != "ok":
        # the error's last line (a candidate's traceback ends with its exception); the whole of it is in the JSON
        why = (str(record.get("error", "")).strip().splitlines() or [""])[-1]
        print(f"{args.model} b={args.batch} ctx={args.context}: {record['status']}: {why} (the record: {out})")
        return 1
    share = record.get("roofline_share")
    print(f"{args.model} b={args.batch} ctx={args.context} {record['candidate_label']}: "
          f"{record['ms_per_token']:.3f} ms/token" + (f", {100 * share:.0f}% of HBM roofline" if share else "")
          + f"  -> {out}")
    return 0
