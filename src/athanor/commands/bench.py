"""`athanor bench NAME`: run one benchmark of `athanor.bench`, print its summary, write its record (`--json`).

Sub-commands register under one `bench` parser; `bench serve` is registered by commands/serve.py, which finds the
sub-parsers as the `bench_subparsers` default of the `bench` parser (`bench` registers before `serve`).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path
from typing import Any

from athanor.errors import ConfigError

log = logging.getLogger(__name__)

DEVICE_HELP = "cpu or cuda[:N] (default: cuda when present, else cpu)"
DTYPE_HELP = "float32, bfloat16, ... (default: bfloat16 on CUDA, float32 on the CPU)"


def register(sub: argparse._SubParsersAction) -> None:
    bench = sub.add_parser("bench", help="run a benchmark and write its JSON record")
    bench_sub = bench.add_subparsers(dest="bench_command", metavar="BENCHMARK", parser_class=type(bench))
    bench.set_defaults(func=lambda args: (bench.print_help(), 2)[1], bench_subparsers=bench_sub)

    def add(name: str, help: str, func: Any, model: str | None = "smollm2-135m") -> argparse.ArgumentParser:
        p = bench_sub.add_parser(name, help=help)
        if model is not None:
            p.add_argument("--model", default=model, help="name, preset (random weights), HF directory or .gguf")
        p.add_argument("--json", default="", help="where to write the record (default: print only)")
        p.set_defaults(func=func)
        return p

    d = add("decode", "per-token decode through the engine's captured path, and its share of the HBM roofline",
            cmd_decode, model=None)
    d.add_argument("--model", required=True, help="preset (random weights), random:PRESET[@SEED], HF dir or .gguf")
    d.add_argument("--batch", default="1", help="batch sizes, comma-separated (e.g. 1,8,32)")
    d.add_argument("--context", default="1024", help="tokens already cached per row, comma-separated")
    d.add_argument("--candidate", default="reference", help="reference, best (best-known), a candidate file, "
                                                            "each optionally +compile; comma-separated")
    d.add_argument("--compile", action="store_true", help="torch.compile every candidate's step (the reference: "
                                                          "its computation in the template, compiled)")
    d.add_argument("--device", default=None, help=DEVICE_HELP)
    d.add_argument("--dtype", default="", help=DTYPE_HELP)
    d.add_argument("--iters", type=int, default=50, help="at least this many timed steps per cell")
    d.add_argument("--routing", default="", help="MoE: a RoutingProfile JSON to replay (default: Zipf-parametric)")
    d.add_argument("--windows", type=int, default=0, help="time each cell's step this many times more (into "
                                                          "window_ms): a steady state or a transient")
    d.add_argument("--kernels", action="store_true", help="CUDA: also profile each cell's step per kernel")

    co = add("collectives", "all-reduce, all-gather and all-to-all over this machine's ranks, and the link they fit "
             "(for athanor plan --calibrate)", cmd_collectives, model=None)
    co.add_argument("--ranks", type=int, default=2, help="processes (one per GPU on CUDA)")
    co.add_argument("--device", default=None, help=DEVICE_HELP)
    co.add_argument("--sizes", default="", help="bytes per rank, comma-separated (default: 4 KiB, 64 KiB, 1 MiB and "
                                                "16 MiB)")
    co.add_argument("--iters", type=int, default=20, help="timed calls per collective and size")

    pf = add("prefill", "time to first token of one long prompt alone, and the TFLOP/s it reaches", cmd_prefill,
             model=None)
    pf.add_argument("--model", required=True, help="preset (random weights), random:PRESET[@SEED], HF dir or .gguf")
    pf.add_argument("--tokens", default="16384", help="prompt lengths, comma-separated (e.g. 16384,32768)")
    pf.add_argument("--candidate", default="best", help="reference, best (best-known), a candidate file, each "
                                                       "optionally +compile; comma-separated")
    pf.add_argument("--chunk", type=int, default=8192, help="tokens a prefill call takes (the server's "
                                                            "--max-num-batched-tokens for a prompt alone)")
    pf.add_argument("--repeats", type=int, default=3, help="timed prefills per length after a warm-up (median)")
    pf.add_argument("--device", default=None, help=DEVICE_HELP)
    pf.add_argument("--dtype", default="", help=DTYPE_HELP)

    s = add("swap", "cold start, swap, experiment and respawn times of the engine", cmd_swap)
    s.add_argument("--device", default=None, help=DEVICE_HELP)
    s.add_argument("--dtype", default="", help="float32, bfloat16, ... (default: as stored)")
    s.add_argument("--swaps", type=int, default=10, help="swaps between two candidates (the median is reported)")
    s.add_argument("--max-seqs", type=int, default=8)
    s.add_argument("--max-seq-len", type=int, default=256)
    s.add_argument("--threads", type=int, default=0, help="CPU threads of the worker (0: torch's default)")
    s.add_argument("--compile", action="store_true", help="also time a torch.compile candidate's swap, cold and warm")

    e = add("evaluate", "the evaluator's A/A noise floor and its verdict on a planted faster candidate", cmd_evaluate,
            model="tiny-dense")
    e.add_argument("--device", default=None, help=DEVICE_HELP)
    e.add_argument("--dtype", default="", help="float32, bfloat16, ... (default: as stored)")
    e.add_argument("--tier", default="fast", choices=("fast", "slow"))
    e.add_argument("--runs", type=int, default=3, help="A/A verdicts")
    e.add_argument("--pairs", type=int, default=64, help="timed decode steps per shape at least")
    e.add_argument("--prefill-pairs", type=int, default=48)
    e.add_argument("--max-pairs", type=int, default=1000, help="timed pairs per shape at most")
    e.add_argument("--budget", type=float, default=1.0, help="seconds of timed runs per shape")
    e.add_argument("--max-seqs", type=int, default=4)
    e.add_argument("--max-seq-len", type=int, default=96)

    c = add("compile", "a whole compile session: wall time, candidates, verified speedup", cmd_compile)
    c.add_argument("--traffic", default="preset:chat", help="a trace file or preset:chat|code|agent")
    c.add_argument("--budget", default="10m", help="wall-clock budget, e.g. 180s, 3m, 1h")
    c.add_argument("--agents", default="variant", help="comma-separated: variant, llm, cli")
    c.add_argument("--device", default=None, help=DEVICE_HELP)
    c.add_argument("--dtype", default="", help="float32, bfloat16 (default: fp32 on CPU, bf16 on CUDA)")
    c.add_argument("--seed", type=int, default=0)
    c.add_argument("--max-seqs", type=int, default=0, help="engine slots (0: device default)")
    c.add_argument("--max-seq-len", type=int, default=0, help="longest context held (0: device default)")
    c.add_argument("--out", default="", help="keep the run directory here (default: a temporary one)")
    c.add_argument("--decode-context", type=int, default=1024, help="time the winner's batch-1 decode step at this "
                                                                    "context (0: not)")
    c.add_argument("--store", default="", help="the experiment store: a path or a postgresql:// URL (default: a "
                                               "SQLite file in the run directory)")
    c.add_argument("--cluster", default="", metavar="ADDRESS", help="screen on a Ray cluster, as `athanor compile "
                                                                    "--cluster` (bench/cluster.sh starts a local one)")

    r = add("reference", "the reference forward's CPU decode against HF transformers'", cmd_reference)
    r.add_argument("--steps", type=int, default=64, help="decode steps timed")
    r.add_argument("--prompt-len", type=int, default=128)
    r.add_argument("--repeats", type=int, default=3, help="fresh processes per side, interleaved (median)")

    st = add("serve-stream", "one stream through `athanor serve` against the bare batch-1 decode step",
             cmd_serve_stream, model="llama-3.2-1b")
    st.add_argument("--device", default=None, help=DEVICE_HELP)
    st.add_argument("--dtype", default="", help=DTYPE_HELP)
    st.add_argument("--candidate", default="", help="a candidate directory both sides run (default: the reference)")
    st.add_argument("--requests", type=int, default=5, help="timed requests, one at a time (median reported)")
    st.add_argument("--prompt-tokens", type=int, default=128)
    st.add_argument("--max-tokens", type=int, default=256)
    st.add_argument("--max-seqs", type=int, default=8, help="the server's KV slots")
    st.add_argument("--max-seq-len", type=int, default=0, help="the server's context (0: prompt + max_tokens + 16)")
    st.add_argument("--context", type=int, default=0, help="the bare step's cached tokens (0: prompt + "
                                                           "max_tokens / 2, the stream's mean)")
    st.add_argument("--threads", type=int, default=0, help="CPU threads of the worker and of the bare step")
    st.add_argument("--iters", type=int, default=50, help="at least this many timed bare steps")

    b = add("serve-batching", "continuous batching: output tokens/s at a concurrency against one at a time",
            cmd_serve_batching)
    b.add_argument("--device", default=None, help=DEVICE_HELP)
    b.add_argument("--dtype", default="", help=DTYPE_HELP)
    b.add_argument("--concurrency", type=int, default=8)
    b.add_argument("--requests-per-client", type=int, default=3)
    b.add_argument("--max-tokens", type=int, default=64)
    b.add_argument("--threads", type=int, default=0, help="CPU threads of the worker (0: the engine's default)")

    t = add("tiers", "the fast tier's ranking against the slow tier's, and screening at equal budget", cmd_tiers)
    t.add_argument("--device", default="cpu", help="cpu or cuda[:N]; --devices for one lane per GPU")
    t.add_argument("--devices", default="", help="comma-separated devices, one lane each (e.g. cuda:0,cuda:1)")
    t.add_argument("--dtype", default="")
    t.add_argument("--traffic", default="preset:chat")
    t.add_argument("--candidates", type=int, default=30)
    t.add_argument("--slow-first", type=int, default=-1, help="only the first N candidates on the slow tier too "
                                                              "(and those the replay confirms); default: all")
    t.add_argument("--budget", type=float, default=480.0, help="seconds of the equal-budget comparison")
    t.add_argument("--max-seqs", type=int, default=0, help="engine slots (0: what athanor compile uses)")
    t.add_argument("--max-seq-len", type=int, default=0)
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--run-dir", default="", help="keep the store here (default: a temporary directory)")
    t.add_argument("--resume", action="store_true", help="continue the run in --run-dir")
    t.add_argument("--report", action="store_true", help="only the figures of the run in --run-dir")
    t.add_argument("--time-limit", type=float, default=0.0, help="start no candidate after this many seconds")
    t.add_argument("--replay", default="", help="only replay a tiers record's equal budget under the current rules")


def _ints(text: str, flag: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ConfigError(f"{flag} {text}: give whole numbers, comma-separated (e.g. 1,8,32)") from None


def _done(record: dict[str, Any], args: argparse.Namespace, lines: list[str]) -> None:
    """Write the record (with --json) and print the summary, the record's path on its last line."""
    from athanor.bench.record import write_record, written

    out = write_record(record, args.json)
    lines[-1] += written(out)
    print("\n".join(lines))


def cmd_decode(args: argparse.Namespace) -> int:
    from rich.console import Console

    from athanor.bench.decode import bench_decode, cell_line
    from athanor.progress import Progress

    # On stderr, so stdout keeps the summary alone; redrawn only between cells, so nothing runs beside a timing.
    with Progress(Console(stderr=True, highlight=False), auto_refresh=False) as progress:
        record = bench_decode(args.model, _ints(args.batch, "--batch"), _ints(args.context, "--context"),
                              candidates=args.candidate, use_compile=args.compile, device=args.device,
                              dtype=args.dtype, iters=args.iters, routing=args.routing or None, kernels=args.kernels,
                              windows=args.windows, status=progress.set)
    cells = record["cells"]
    _done(record, args, [cell_line(c) for c in cells])
    failed = any(c["status"] == "error" for c in cells) or not any(c["status"] == "ok" for c in cells)
    return 1 if failed else 0


def cmd_collectives(args: argparse.Namespace) -> int:
    from athanor.bench.collectives import bench_collectives, summary_lines

    record = bench_collectives(args.ranks, args.device, tuple(_ints(args.sizes, "--sizes")), args.iters)
    _done(record, args, summary_lines(record))
    return 0


def cmd_prefill(args: argparse.Namespace) -> int:
    from rich.console import Console

    from athanor.bench.prefill import bench_prefill, prefill_lines
    from athanor.progress import Progress

    # On stderr, so stdout keeps the summary alone; redrawn only between timings, so nothing runs beside one.
    with Progress(Console(stderr=True, highlight=False), auto_refresh=False) as progress:
        record = bench_prefill(args.model, _ints(args.tokens, "--tokens"), candidates=args.candidate,
                               device=args.device, dtype=args.dtype, chunk=args.chunk, repeats=args.repeats,
                               status=progress.set)
    _done(record, args, prefill_lines(record))
    return 0 if all(c["status"] == "ok" for c in record["cells"]) else 1


def cmd_swap(args: argparse.Namespace) -> int:
    from athanor.bench.record import default_device
    from athanor.bench.swap import bench_swap

    if args.swaps < 1:
        raise ConfigError("--swaps must be at least 1")
    record = bench_swap(args.model, device=default_device(args.device), dtype=args.dtype, num_swaps=args.swaps,
                        max_seqs=args.max_seqs, max_seq_len=args.max_seq_len, cpu_threads=args.threads,
                        with_compile=args.compile)
    keys = ("cold_start_s", "swap_s", "experiment_s", "respawn_s", "compile_swap_first_s", "compile_swap_warm_s")
    _done(record, args, [f"{args.model} on {record['device_name']}: "
                         + "  ".join(f"{k}={record[k]:.3f}" for k in keys if k in record)])
    return 0


def cmd_evaluate(args: argparse.Namespace) -> int:
    from athanor.bench.evaluate import bench_evaluate, summary_lines
    from athanor.evaluate import EvaluateConfig

    config = EvaluateConfig(model=args.model, device=args.device or "", dtype=args.dtype, tier=args.tier,
                            max_seqs=args.max_seqs, max_seq_len=args.max_seq_len, decode_pairs=args.pairs,
                            prefill_pairs=args.prefill_pairs, max_pairs=args.max_pairs,
                            timing_budget_s=args.budget)
    record = bench_evaluate(config, runs=args.runs)
    _done(record, args, summary_lines(record))
    return 0


def cmd_compile(args: argparse.Namespace) -> int:
    from athanor.agents.registry import parse_agent_names
    from athanor.bench.compile import bench_compile, summary_line
    from athanor.commands.compile import parse_duration
    from athanor.loop import CompileConfig

    config = CompileConfig(model=args.model, traffic=args.traffic, budget_s=parse_duration(args.budget),
                           agents=tuple(parse_agent_names(args.agents)), device=args.device or "", dtype=args.dtype,
                           seed=args.seed, max_seqs=args.max_seqs, max_seq_len=args.max_seq_len, store=args.store,
                           cluster=args.cluster)
    record = bench_compile(config, run_dir=args.out or None, decode_context=args.decode_context,
                           on_event=lambda line: print(line, file=sys.stderr, flush=True))  # progress; the summary last
    _done(record, args, [summary_line(record)])
    return 0


def cmd_reference(args: argparse.Namespace) -> int:
    from athanor.bench.reference import bench_reference, summary_lines

    record = bench_reference(args.model, steps=args.steps, prompt_len=args.prompt_len, repeats=args.repeats)
    _done(record, args, summary_lines(record))
    return 0


def cmd_serve_stream(args: argparse.Namespace) -> int:
    from athanor.bench.stream import bench_stream, summary_lines

    record = bench_stream(args.model, device=args.device, dtype=args.dtype, candidate_dir=args.candidate,
                          requests=args.requests, prompt_tokens=args.prompt_tokens, max_tokens=args.max_tokens,
                          max_seqs=args.max_seqs, max_seq_len=args.max_seq_len, context=args.context,
                          threads=args.threads, iters=args.iters)
    _done(record, args, summary_lines(record))
    return 0 if record["bare"].get("status") == "ok" else 1


def cmd_serve_batching(args: argparse.Namespace) -> int:
    from athanor.bench.batching import bench_batching, summary_line

    record = bench_batching(args.model, device=args.device, dtype=args.dtype, concurrency=args.concurrency,
                            per_client=args.requests_per_client, max_tokens=args.max_tokens, threads=args.threads)
    _done(record, args, [summary_line(record)])
    return 0


def cmd_tiers(args: argparse.Namespace) -> int:
    from athanor.bench import tier_figures
    from athanor.bench.tiers import TiersOptions, bench_tiers, summary_lines

    if args.replay:
        path = Path(args.replay)
        if not path.is_file():
            raise ConfigError(f"--replay {args.replay}: no such file (a record of `athanor bench tiers`)")
        recorded = json.loads(path.read_text())
        record = {"benchmark": "tiers-replay", "replayed": str(path), **tier_figures.replayed(recorded, args.budget)}
        eb = record["equal_budget"]
        _done(record, args, [f"{eb['reserve_s']:.0f} s kept to confirm: fast+slow screens "
                             f"{eb['fast_slow']['screened']}, slow only evaluates {eb['slow_only']['evaluated']}: "
                             f"{eb['screened_ratio']:.2f}x"])
        return 0
    devices = tuple(d.strip() for d in (args.devices or args.device).split(",") if d.strip())
    options = TiersOptions(model=args.model, devices=devices, dtype=args.dtype, traffic=args.traffic,
                           candidates=args.candidates, slow_first=args.slow_first, budget_s=args.budget,
                           max_seqs=args.max_seqs, max_seq_len=args.max_seq_len, seed=args.seed,
                           run_dir=args.run_dir, resume=args.resume, report_only=args.report,
                           time_limit_s=args.time_limit)
    record = bench_tiers(options)
    _done(record, args, summary_lines(record))
    return 0
