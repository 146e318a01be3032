"""`athanor serve` and `athanor bench serve`: thin wrappers over `athanor.serve` (`athanor watch`, which
follows a server's log, is the loop's: commands/compile.py).

`bench serve` joins the `bench` command's sub-parsers (see commands/bench.py, which stores them as the
`bench_subparsers` default of the `bench` parser; `bench` registers before `serve`).
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

GPU_STEP_TOKENS = 8192
"""A step's default token budget on a GPU: long prompts go in chunks big enough for the GEMMs to be compute-bound
(vLLM's default for its API server), and a step's decode rows wait one such chunk at most."""
CPU_STEP_TOKENS = 256
"""The CPU's: a chunk of 256 rows already keeps its GEMMs busy, and decode rows wait less behind it."""


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("serve", help="serve a model over an OpenAI-compatible HTTP API, with canary deploys")
    # vLLM's spelling first (`serve MODEL`, --max-model-len), athanor's kept as aliases.
    p.add_argument("model_arg", nargs="?", default=None, metavar="MODEL",
                   help="name, preset, HF directory or .gguf file (default: smollm2-135m; also --model)")
    p.add_argument("--model", default=None, help=argparse.SUPPRESS)
    p.add_argument("--candidate", default="", help="a candidate directory (candidate.py + manifest.json) to serve")
    p.add_argument("--host", default="127.0.0.1", help="the address to listen on")
    p.add_argument("--port", type=int, default=8000, help="the port to listen on")
    p.add_argument("--served-model-name", default="", help="the model name clients pass (default: --model)")
    p.add_argument("--admin-token-file", default="", help="file holding the admin API's bearer token "
                                                          "(without it the admin API is off)")
    p.add_argument("--api-key", default="", help="a bearer key every /v1 request must send (default: none)")
    p.add_argument("--log", default="", help="request log to append to (JSONL, the 'athanor' trace format)")
    p.add_argument("--log-prompts", action="store_true", help="also log prompt text (off: lengths and hashes only)")
    p.add_argument("--store", default="", help="experiment store (path or URL) recording deployments")
    p.add_argument("--device", default=None, help="cpu or cuda[:N] (default: CUDA when present, else cpu)")
    p.add_argument("--dtype", default="", help="float32, bfloat16, ... (default: bfloat16 on CUDA, as stored on "
                                               "the CPU)")
    p.add_argument("--max-seqs", type=int, default=8, help="sequences served at once (KV slots per candidate)")
    p.add_argument("--max-model-len", "--max-seq-len", dest="max_seq_len", type=int, default=0,
                   help="context length (prompt + output tokens) (default: the model's, max_position_embeddings)")
    p.add_argument("--kv-tokens", type=int, default=0, help="KV pool of each candidate, in tokens (default: on CUDA "
                   "what free memory holds after the weights and the candidate, shared with a canary's challenger unless "
                   "--no-canary; on the CPU "
                   "2,048 a sequence, or one whole --max-model-len if more)")
    p.add_argument("--max-num-batched-tokens", type=int, default=0, help="token budget of one step (default: "
                   f"{GPU_STEP_TOKENS} on CUDA, {CPU_STEP_TOKENS} on the CPU)")
    p.add_argument("--max-queue", type=int, default=256, help="waiting requests before answering 429")
    p.add_argument("--threads", type=int, default=0, help="CPU threads of the worker (0: the engine's default)")
    p.add_argument("--no-canary", action="store_true", help="one resident candidate, whose KV pool takes the "
                   "memory a deploy's challenger would share; /admin/deploy is refused (409)")
    p.add_argument("--layout", default="", help="serve one replica over several ranks: tp=N, ep=N, dcp=N (e.g. "
                   "tp=2), each rank a process holding its shard of the model (default: one device)")
    p.add_argument("--no-sandbox", action="store_true", help="run candidate code unconfined (trusted code only)")
    p.set_defaults(func=cmd_serve)

    # `bench` registers first (see COMMAND_MODULES in athanor.cli) and keeps its sub-parsers as a default.
    _register_bench(sub.choices["bench"].get_default("bench_subparsers"))


def _register_bench(bench_sub: argparse._SubParsersAction) -> None:
    b = bench_sub.add_parser("serve", help="replay a trace against a running server with the openai client")
    b.add_argument("--base-url", "--url", dest="url", required=True, help="the server's base URL, e.g. http://127.0.0.1:8000")
    b.add_argument("--trace", default="", help="a trace file (any format `athanor traffic` reads) to replay")
    b.add_argument("--random-input-len", type=int, default=0, help="instead of a trace, synthetic requests (vLLM's "
                   "random dataset): --max-requests prompts of this many tokens, sent at once or at --request-rate")
    b.add_argument("--random-output-len", type=int, default=128, help="tokens each synthetic request asks for")
    b.add_argument("--random-prefix-len", type=int, default=0, help="leading tokens every synthetic prompt shares")
    b.add_argument("--speedup", type=float, default=1.0, help="replay this many times faster than recorded")
    b.add_argument("--max-requests", "--num-prompts", dest="max_requests", type=int, default=100,
                   help="send at most this many requests")
    b.add_argument("--model", default="", help="model name to request (default: the server's first model)")
    b.add_argument("--max-input", type=int, default=0, help="cap prompt lengths (0: the server's context allows)")
    b.add_argument("--max-output", type=int, default=0, help="cap output lengths (0: as in the trace)")
    b.add_argument("--slo-ttft", type=float, default=2.0, help="TTFT SLO in seconds (goodput)")
    b.add_argument("--slo-tpot", type=float, default=0.2, help="TPOT SLO in seconds (goodput)")
    b.add_argument("--concurrency", type=int, default=64, help="requests in flight at most")
    b.add_argument("--request-rate", type=float, default=0.0, help="requests per second as a Poisson process "
                                                                   "instead of the trace's times (0: the trace's)")
    b.add_argument("--seed", type=int, default=0, help="seeds --request-rate's arrivals")
    b.add_argument("--json", default="", help="where to write the record (default: print only)")
    b.set_defaults(func=cmd_bench_serve)


def check_port_free(host: str, port: int) -> None:
    """A one-line error where `host:port` cannot be listened on (in use, or not an address of this machine)."""
    import socket

    from athanor.errors import ConfigError

    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as e:
        raise ConfigError(f"--host {host}: not an address here ({e.strerror})") from None
    family, kind, proto, _, address = infos[0]
    with socket.socket(family, kind, proto) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds: TIME_WAIT is no conflict
        try:
            sock.bind(address)
        except OSError as e:
            raise ConfigError(f"--port {port}: cannot listen on {host}:{port} ({e.strerror}); choose another "
                              "--port") from None


def read_admin_token(path: str) -> str:
    """The admin bearer token in the file at `path` (`--admin-token-file`); "" when no file is given."""
    from athanor.errors import ConfigError

    if not path:
        return ""
    try:
        token = Path(path).read_text().strip()
    except OSError as e:
        raise ConfigError(f"--admin-token-file {path}: cannot read it ({e.strerror})") from None
    if not token:
        raise ConfigError(f"--admin-token-file {path}: the file is empty; put the admin bearer token in it")
    return token


def cmd_serve(args: argparse.Namespace) -> int:
    from athanor.engine.candidate_dir import load_candidate_dir
    from athanor.engine.config import EngineConfig, parse_layout
    from athanor.engine.group import check_layout
    from athanor.errors import ConfigError
    from athanor.model.device import resolve_device
    from athanor.seams import declared_layout, layout_name
    from athanor.serve.app import run_server
    from athanor.serve.config import SchedulerConfig
    from athanor.serve.state import ServeOptions

    if args.model_arg and args.model and args.model_arg != args.model:
        raise ConfigError(f"serve {args.model_arg} --model {args.model}: name the model once")
    args.model = args.model_arg or args.model or "smollm2-135m"
    device = resolve_device(args.device)
    if not args.max_seq_len:
        from athanor.model.registry import load_spec

        args.max_seq_len = load_spec(args.model).max_position_embeddings
    # A GPU serves in bf16 unless told otherwise: what vLLM's "auto" does for a float32 checkpoint too, and what
    # every random preset is benchmarked in.
    dtype = args.dtype or ("bfloat16" if device.type == "cuda" else "")
    step_tokens = args.max_num_batched_tokens or (GPU_STEP_TOKENS if device.type == "cuda" else CPU_STEP_TOKENS)
    if args.max_seqs < 1 or args.max_seq_len < 2:
        raise ConfigError("--max-seqs must be >= 1 and --max-seq-len >= 2")
    if args.kv_tokens < 0 or 0 < args.kv_tokens < args.max_seq_len:
        raise ConfigError(f"--kv-tokens {args.kv_tokens}: the pool must hold at least one whole context "
                          f"(--max-model-len {args.max_seq_len}), or leave it out")
    if step_tokens < args.max_seqs:
        raise ConfigError(f"--max-num-batched-tokens {step_tokens}: must be at least --max-seqs "
                          f"({args.max_seqs}), so every running sequence can decode in one step")
    layout = parse_layout(args.layout)
    if args.candidate:  # a bad directory is the user's mistake: say so before starting
        declared = declared_layout(load_candidate_dir(args.candidate).source, f"--candidate {args.candidate}")
        if declared is not None and args.layout and declared != layout:
            raise ConfigError(f"--layout {args.layout}: the candidate in {args.candidate} declares LAYOUT = "
                              f"\"{layout_name(declared)}\"; drop --layout to serve it in its layout")
        layout = layout if declared is None else declared  # a compile's winner runs in the layout it won in
    check_layout(EngineConfig(model=args.model, device=device.type, layout=layout))
    check_port_free(args.host, args.port)  # before the model loads, not after
    options = ServeOptions(
        model=args.model, candidate_dir=args.candidate, served_model_name=args.served_model_name, device=str(device),
        dtype=dtype, max_seqs=args.max_seqs, max_seq_len=args.max_seq_len, kv_tokens=args.kv_tokens,
        threads=args.threads, canaries=not args.no_canary, layout=layout,
        sandbox=not args.no_sandbox, admin_token=read_admin_token(args.admin_token_file), api_key=args.api_key,
        log_path=args.log,
        log_prompts=args.log_prompts, store=args.store,
        scheduler=SchedulerConfig(max_num_batched_tokens=step_tokens, max_queue=args.max_queue))
    logging.getLogger("athanor").setLevel(logging.INFO)
    log.info("serving %s (%s) on %s%s in %s: up to %d sequences of up to %d tokens, %d tokens a step", args.model,
             args.candidate or "the reference forward", device, f" as {layout_name(layout)}" if layout else "",
             dtype or "the stored dtype", args.max_seqs, args.max_seq_len, step_tokens)
    run_server(options, args.host, args.port)
    return 0


def results_table(s: dict[str, Any]) -> str:
    """A bench serve summary as rows of name and value (vLLM's benchmark prints the same figures)."""
    def ms(d: dict[str, float]) -> str:
        return " / ".join(f"{1000 * d[k]:.1f}" for k in ("mean", "p50", "p90", "p99"))

    rows = [("requests ok / sent", f"{s['completed']} / {s['requests']}"), ("duration (s)", f"{s['duration_s']:.2f}"),
            ("output tokens/s", f"{s['output_tokens_per_s']:.1f}"), ("requests/s", f"{s['requests_per_s']:.2f}"),
            ("goodput (requests/s within the SLOs)", f"{s['goodput_requests_per_s']:.2f}"),
            ("TTFT ms (mean / p50 / p90 / p99)", ms(s["ttft_s"])), ("TPOT ms", ms(s["tpot_s"])),
            ("ITL ms", ms(s["itl_s"])), ("E2E ms", ms(s["e2e_s"])),
            ("prompt tokens computed / sent", f"{s['server_prefill_tokens']:.0f} / {s['server_prompt_tokens']:.0f}")]
    steps = s.get("server_steps") or {}
    for kind, k in (steps.get("by_kind") or {}).items():
        if k["steps"]:
            rate = f", {k['prefill_tokens_per_s']:.0f} prompt tok/s" if k["prefill_tokens_per_s"] else ""
            rows.append((f"{kind} steps (n / s / ms each)", f"{k['steps']:.0f} / {k['seconds']:.1f} / "
                                                            f"{1000 * k['seconds'] / k['steps']:.1f}{rate}"))
    if steps.get("busy_share") is not None:
        rows.append(("worker busy (share of the duration)", f"{steps['busy_share']:.2f}"))
    if s.get("prefill_vs_lru"):
        rows.append((f"computed vs an LRU cache of {s['kv_pool_tokens']:.0f} tokens", f"{s['prefill_vs_lru']:.2f}x"))
    width = max(len(name) for name, _ in rows)
    return "\n".join(f"{name:<{width}}  {value}" for name, value in rows)


def cmd_bench_serve(args: argparse.Namespace) -> int:
    from rich.console import Console

    from athanor.bench.record import write_record, written
    from athanor.bench.serve import BenchOptions, bench_serve
    from athanor.progress import Progress

    options = BenchOptions(
        url=args.url, trace=args.trace, speedup=args.speedup, max_requests=args.max_requests, model=args.model,
        max_input=args.max_input, max_output=args.max_output, slo_ttft_s=args.slo_ttft, slo_tpot_s=args.slo_tpot,
        concurrency=args.concurrency, request_rate=args.request_rate, seed=args.seed,
        random_input_len=args.random_input_len, random_output_len=args.random_output_len,
        random_prefix_len=args.random_prefix_len)
    # On stderr, so stdout keeps the results alone; redrawn at the replay's own updates, from its thread, so no
    # thread of the status line's competes with the replay's clock readings.
    with Progress(Console(stderr=True, highlight=False), auto_refresh=False) as progress:
        record = bench_serve(options, status=progress.set)
    out = write_record(record, args.json)
    s = record["summary"]
    print(results_table(s))
    print(f"{s['completed']}/{s['requests']} ok, {s['output_tokens_per_s']:.1f} tok/s, "
          f"TTFT p50 {s['ttft_s']['p50']:.3f}s, TPOT p50 {s['tpot_s']['p50']:.4f}s, "
          f"goodput {s['goodput_requests_per_s']:.2f} req/s, prompt tokens computed by the server "
          f"{s['server_prefill_tokens']:.0f} of {s['server_prompt_tokens']:.0f}"
          + (f" ({s['prefill_vs_lru']:.2f}x an LRU cache of {s['kv_pool_tokens']:.0f} tokens)"
             if s["prefill_vs_lru"] else "")
          + (" (interrupted: the requests that finished)" if s["interrupted"] else "") + written(out))
    return 0 if s["failed"] == 0 else 1
