"""`athanor bench serve-stream`: one stream through `athanor serve` against the engine's bare batch-1 decode step.

Starts `athanor serve`, sends one streaming, greedy completion at a time with the `openai` client (a seeded
prompt of token ids) and times each token's arrival; a request's decode time per token is (arrival of its last
token - arrival of its first) / (tokens - 1), so the first token (prefill, TTFT) is left out, and the median over
the requests is the server's figure. Then, with the server stopped, `athanor bench decode`'s `decode_cell` times
the bare engine step (batch 1, context = prompt + max_tokens / 2, the stream's mean) for the same model, device,
dtype and candidate. The bare figure is back-to-back steps without a host sync between them; serving must learn
each step's token, so whatever the host does per step and does not overlap with the device adds to the
server's figure. The ratio of the two is what serving costs over the step.

A server stops a sequence on its tokenizer's stop ids (random-weight presets have none), so with a real model a
request may end early: the record keeps the tokens each request produced.
"""

from __future__ import annotations

import itertools
import os
import random
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from athanor.bench.decode import decode_cell
from athanor.bench.record import default_device, default_dtype, provenance
from athanor.errors import ConfigError

TARGET_RATIO = 1.15
"""Server ms/token over bare ms/token at most this: serving a single stream costs at most 15% over its step."""


def stream_once(client: Any, model: str, prompt: list[int], max_tokens: int, seed: int) -> dict[str, Any]:
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


def _serve(serve_args: list[str], model: str, prompts: list[list[int]], max_tokens: int) -> list[dict[str, Any]]:
    from openai import OpenAI

    from athanor.serve.launch import ServerProcess

    with tempfile.TemporaryDirectory() as tmp:
        server = ServerProcess(serve_args, Path(tmp) / "serve.log")
        server.start(timeout_s=600)  # a 1B preset: random weights made twice (tokenizer probe, worker), graphs
        try:
            client = OpenAI(base_url=f"{server.url}/v1", api_key="unused", timeout=600)
            stream_once(client, model, prompts[0], 8, seed=0)  # warm-up: first prefill and decode shapes
            return [stream_once(client, model, prompt, max_tokens, seed=k) for k, prompt in enumerate(prompts)]
        finally:
            server.stop()


def bench_stream(model: str = "llama-3.2-1b", device: str | None = None, dtype: str = "", candidate_dir: str = "",
                 requests: int = 5, prompt_tokens: int = 128, max_tokens: int = 256, max_seqs: int = 8,
                 max_seq_len: int = 0, context: int = 0, threads: int = 0, iters: int = 50) -> dict[str, Any]:
    """The server's and the bare step's ms/token for one stream; the record.

    `candidate_dir`: a candidate directory both sides run (default: the reference forward, the server's
    baseline). `max_seq_len` 0: prompt + max_tokens + 16; `context` 0: prompt + max_tokens / 2; `threads` 0: the
    engine's default on the CPU."""
    from athanor.model.registry import load_spec

    if min(requests, prompt_tokens, max_tokens) < 1 or max_tokens < 2:
        raise ConfigError("--requests and --prompt-tokens must be at least 1, --max-tokens at least 2")
    device = default_device(device)
    dtype = default_dtype(device, dtype)
    max_seq_len = max_seq_len or prompt_tokens + max_tokens + 16
    context = context or prompt_tokens + max_tokens // 2
    vocab = load_spec(model).vocab_size
    prompts = [[rng.randrange(vocab) for _ in range(prompt_tokens)]
               for rng in (random.Random(1000 + k) for k in range(requests))]
    serve_args = ["--model", model, "--device", device, "--dtype", dtype, "--max-seqs", str(max_seqs),
                  "--max-seq-len", str(max_seq_len), "--threads", str(threads)]
    if candidate_dir:
        serve_args += ["--candidate", candidate_dir]
    t = time.perf_counter()
    served = _serve(serve_args, model, prompts, max_tokens)
    server_wall_s = time.perf_counter() - t
    per_token = [r["ms_per_token"] for r in served if r["ms_per_token"] is not None]
    if not per_token:
        raise RuntimeError(f"every request ended after its first token (an end-of-sequence token): {served}")
    server_ms = statistics.median(per_token)
    gaps = [r["median_gap_ms"] for r in served if r["median_gap_ms"] is not None]

    # The bare step in this process, as the worker runs it: no autograd, the worker's CPU thread count.
    torch.set_grad_enabled(False)
    if torch.device(device).type == "cpu":
        torch.set_num_threads(threads or max(1, len(os.sched_getaffinity(0)) - 1))
    candidate = str(Path(candidate_dir) / "candidate.py") if candidate_dir else "reference"
    bare = decode_cell(model, 1, context, candidate=candidate, device=device, dtype=dtype, iters=iters)
    bare_ms = bare.get("ms_per_token")
    ratio = server_ms / bare_ms if bare_ms else None
    return {"benchmark": "serve-stream", "model": model, "dtype": dtype, "candidate": candidate_dir or "reference",
            **provenance(device), "prompt_tokens": prompt_tokens, "max_tokens": max_tokens,
            "server_max_seqs": max_seqs, "server_max_seq_len": max_seq_len, "bare_context": context,
            "threads": threads, "load_average": os.getloadavg(),
            "server": {"ms_per_token": server_ms, "tokens_per_s": 1000 / server_ms,
                       "median_gap_ms": statistics.median(gaps) if gaps else None,
                       "ttft_s": statistics.median(r["ttft_s"] for r in served), "wall_s": server_wall_s,
                       "requests": served},
            "bare": bare, "ratio": ratio, "target_ratio": TARGET_RATIO,
            "within_target": ratio is not None and ratio <= TARGET_RATIO}


def summary_lines(record: dict[str, Any]) -> list[str]:
    """The server's and the bare step's ms/token and tokens/s, and their ratio."""
    server, bare = record["server"], record["bare"]
    tokens = ", ".join(str(r["completion_tokens"]) for r in server["requests"])
    lines = [f"{record['model']} {record['device']} {record['dtype']} {record['candidate']}: "
             f"{len(server['requests'])} requests (tokens {tokens}), TTFT {server['ttft_s'] * 1000:.1f} ms",
             f"{'':24}{'ms/token':>10}{'tokens/s':>10}",
             f"{'server, one stream':24}{server['ms_per_token']:10.3f}{server['tokens_per_s']:10.1f}"]
    if bare.get("status") == "ok":
        ms = bare["ms_per_token"]
        lines.append(f"{'bare step, ctx ' + str(bare['context']):24}{ms:10.3f}{1000 / ms:10.1f}")
        lines.append(f"ratio {record['ratio']:.3f}  within {100 * (TARGET_RATIO - 1):.0f}%: "
                     f"{'yes' if record['within_target'] else 'no'}")
    else:
        lines.append(f"bare step: {bare.get('status')}: {bare.get('error', '')}")
    return lines
