"""One stream through `athanor serve` against the engine's bare batch-1 decode step (issue 8).

Starts `athanor serve` for a model, sends one streaming completion at a time with the `openai`
client (a seeded prompt of token ids, greedy, `max_tokens` 256) and times each token's arrival;
a request's decode time per token is (arrival of its last token - arrival of its first) /
(tokens - 1), so the first token (prefill, TTFT) is left out. The median over the requests is the
server's figure. Then, with the server stopped, `athanor bench decode`'s `bench_decode` times the
bare engine step (batch 1, context = prompt + max_tokens / 2, CUDA graphs where the device has
them) for the same model, device, dtype and candidate: `reference` is the server's default
forward (`baseline_candidate()`), and `--candidate DIR` serves DIR and benches DIR/candidate.py.
The bare figure is back-to-back steps without a host sync between them; serving must sync every
step to learn its token, so whatever the host does per step (inputs, bookkeeping, the report to
the front end) adds to the server's figure. Under CUDA graphs the reference attends over its
whole cache: the server's `--max-seq-len` (400 by default) against the bench's context + 16 (272).

The server stops a sequence only on its tokenizer's stop ids; random-weight presets have no
tokenizer (so no EOS), and the server has no `ignore_eos`, so with a real model a request may end
early: the record keeps the tokens each request actually produced. Target (issue 8, H200,
llama-3.2-1b): server ms/token within 15% of the bare figure.

    python bench/serve_stream.py [--model llama-3.2-1b] [--device cuda] [--dtype bfloat16]
        [--candidate DIR] [--requests 5] [--out bench/results/serve_stream_<device>.json]
"""

from __future__ import annotations

import argparse
import itertools
import os
import random
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from openai import OpenAI

from _record import write
from athanor.model.registry import load_spec
from athanor.moves.decode_bench import bench_decode
from athanor.serve.launch import ServerProcess

TARGET_RATIO = 1.15
"""Server ms/token over bare ms/token at most this (issue 8)."""


def stream_once(client: OpenAI, model: str, prompt: list[int], max_tokens: int, seed: int) -> dict[str, Any]:
    """One streamed, greedy completion: TTFT, tokens produced and decode time per token from arrival times."""
    t0 = time.perf_counter()
    stream = client.completions.create(model=model, prompt=prompt, max_tokens=max_tokens, temperature=0.0,
                                       seed=seed, stream=True, stream_options={"include_usage": True})
    arrivals: list[float] = []  # chunks that carry text: one per token unless the detokenizer holds a piece back
    last, finish, completion_tokens = t0, None, 0
    for chunk in stream:
        now = time.perf_counter()
        if chunk.usage is not None:
            completion_tokens = chunk.usage.completion_tokens
        for choice in chunk.choices:
            if choice.text:
                arrivals.append(now)
            if choice.finish_reason is not None:
                last, finish = now, choice.finish_reason
    if not arrivals:
        raise RuntimeError(f"the request produced no text (finish_reason {finish!r})")
    gaps = [b - a for a, b in itertools.pairwise(arrivals)]
    decode_s = last - arrivals[0]
    return {"completion_tokens": completion_tokens, "finish_reason": finish, "text_chunks": len(arrivals),
            "ttft_s": arrivals[0] - t0, "e2e_s": last - t0, "decode_s": decode_s,
            "ms_per_token": 1000 * decode_s / (completion_tokens - 1) if completion_tokens > 1 else None,
            "median_gap_ms": 1000 * statistics.median(gaps) if gaps else None,
            "max_gap_ms": 1000 * max(gaps) if gaps else None}


def run_server(args: argparse.Namespace, prompts: list[list[int]], max_seq_len: int) -> list[dict[str, Any]]:
    serve_args = ["--model", args.model, "--device", args.device, "--dtype", args.dtype,
                  "--max-seqs", str(args.max_seqs), "--max-seq-len", str(max_seq_len), "--threads", str(args.threads)]
    if args.candidate:
        serve_args += ["--candidate", args.candidate]
    with tempfile.TemporaryDirectory() as tmp:
        server = ServerProcess(serve_args, Path(tmp) / "serve.log")
        server.start(timeout_s=600)  # a 1B preset: random weights made twice (tokenizer probe, worker), graphs
        try:
            client = OpenAI(base_url=f"{server.url}/v1", api_key="unused", timeout=600)
            stream_once(client, args.model, prompts[0], 8, seed=0)  # warm-up: first prefill and decode shapes
            return [stream_once(client, args.model, prompt, args.max_tokens, seed=k)
                    for k, prompt in enumerate(prompts)]
        finally:
            server.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    cuda = torch.cuda.is_available()
    ap.add_argument("--model", default="llama-3.2-1b", help="preset (random weights), HF dir or .gguf")
    ap.add_argument("--device", default="cuda" if cuda else "cpu")
    ap.add_argument("--dtype", default="", help="default: bfloat16 on CUDA, float32 on the CPU")
    ap.add_argument("--candidate", default="", help="a candidate directory (candidate.py + manifest.json) for both "
                                                    "sides; default: the reference forward (the server's baseline)")
    ap.add_argument("--requests", type=int, default=5, help="timed requests, one at a time (median reported)")
    ap.add_argument("--prompt-tokens", type=int, default=128)
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--max-seqs", type=int, default=8, help="the server's KV slots (it decodes one row here)")
    ap.add_argument("--max-seq-len", type=int, default=0, help="the server's context (0: prompt + max_tokens + 16)")
    ap.add_argument("--context", type=int, default=0, help="the bare step's cached tokens "
                                                           "(0: prompt + max_tokens / 2, the stream's mean)")
    ap.add_argument("--threads", type=int, default=0, help="CPU threads of the worker and of the bare step "
                                                           "(0: the engine's default on each device)")
    ap.add_argument("--iters", type=int, default=50, help="at least this many timed bare steps")
    ap.add_argument("--out", default="", help="a .json file, or a directory for serve_stream_<device>.json "
                                              "(default: bench/results)")
    args = ap.parse_args()
    device_type = torch.device(args.device).type
    args.dtype = args.dtype or ("bfloat16" if device_type == "cuda" else "float32")
    max_seq_len = args.max_seq_len or args.prompt_tokens + args.max_tokens + 16
    context = args.context or args.prompt_tokens + args.max_tokens // 2
    out = Path(args.out or Path(__file__).parent / "results")
    if out.suffix != ".json":
        out = out / f"serve_stream_{device_type}.json"

    vocab = load_spec(args.model).vocab_size
    prompts = [[rng.randrange(vocab) for _ in range(args.prompt_tokens)]
               for rng in (random.Random(1000 + k) for k in range(args.requests))]
    t = time.perf_counter()
    requests = run_server(args, prompts, max_seq_len)
    server_wall_s = time.perf_counter() - t
    per_token = [r["ms_per_token"] for r in requests if r["ms_per_token"] is not None]
    if not per_token:
        raise SystemExit(f"every request ended after its first token (an EOS): {requests}")
    server_ms = statistics.median(per_token)
    gap_ms = statistics.median(r["median_gap_ms"] for r in requests if r["median_gap_ms"] is not None)

    # The bare step in this process, as the worker runs it: no autograd, the worker's CPU thread count.
    torch.set_grad_enabled(False)
    if device_type == "cpu":
        torch.set_num_threads(args.threads or max(1, len(os.sched_getaffinity(0)) - 1))
    candidate = str(Path(args.candidate) / "candidate.py") if args.candidate else "reference"
    bare = bench_decode(args.model, 1, context, candidate=candidate, device=args.device, dtype=args.dtype,
                        iters=args.iters)
    bare_ms = bare.get("ms_per_token")
    ratio = server_ms / bare_ms if bare_ms else None
    record = {"benchmark": "serve_stream", "model": args.model, "device": args.device, "dtype": args.dtype,
              "candidate": args.candidate or "reference", "prompt_tokens": args.prompt_tokens,
              "max_tokens": args.max_tokens, "server_max_seqs": args.max_seqs, "server_max_seq_len": max_seq_len,
              "bare_context": context, "threads": args.threads, "load_average": os.getloadavg(),
              "server": {"ms_per_token": server_ms, "tokens_per_s": 1000 / server_ms,
                         "median_gap_ms": gap_ms,
                         "ttft_s": statistics.median(r["ttft_s"] for r in requests),
                         "wall_s": server_wall_s, "requests": requests},
              "bare": bare, "ratio": ratio, "target_ratio": TARGET_RATIO,
              "within_target": ratio is not None and ratio <= TARGET_RATIO}
    path = write(record, out)

    tokens = ", ".join(str(r["completion_tokens"]) for r in requests)
    print(f"{args.model} {args.device} {args.dtype} {record['candidate']}: {len(requests)} requests "
          f"(tokens {tokens}), TTFT {record['server']['ttft_s'] * 1000:.1f} ms  -> {path}")
    print(f"{'':24}{'ms/token':>10}{'tokens/s':>10}")
    print(f"{'server, one stream':24}{server_ms:10.3f}{1000 / server_ms:10.1f}")
    if bare_ms:
        print(f"{f'bare step, ctx {context}':24}{bare_ms:10.3f}{1000 / bare_ms:10.1f}")
        verdict = "yes" if record["within_target"] else "no"
        print(f"ratio {ratio:.3f}  within {100 * (TARGET_RATIO - 1):.0f}%: {verdict}")
    else:
        print(f"bare step: {bare.get('status')}: {bare.get('error', '')}")


if __name__ == "__main__":
    main()
