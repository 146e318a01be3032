"""`athanor bench serve-batching`: continuous batching's output tokens/s at a concurrency against one request at a
time.

Starts `athanor serve`, then runs closed loops with the `openai` client: C clients, each sending requests back to
back (sampled, fixed seeds), for C = 1 and C = `concurrency`. The ratio of their output tokens/s is what batching
buys on the device.
"""

from __future__ import annotations

import asyncio
import tempfile
import time
from pathlib import Path
from typing import Any

from athanor.bench.record import default_device, default_dtype, provenance
from athanor.errors import ConfigError

PROMPTS = ["Once upon a time, in a small village,", "The history of the printing press", "Write a short poem about "
           "the sea:", "Explain why the sky is blue.", "My favourite recipe for bread is", "In the year 2050, cities",
           "A letter to my younger self:", "The rules of chess are simple:"]
TARGET_SPEEDUP = 3.0
"""Concurrency 8 should give at least this many times the output tokens/s of one request at a time."""


def prompts_for(model: str) -> list[str] | list[list[int]]:
    """`PROMPTS` as text, or as their bytes' token ids for a model without a tokenizer (a random preset)."""
    from athanor.model.registry import load_spec, preset_of

    if preset_of(model) is None:
        return PROMPTS
    vocab = load_spec(model).vocab_size
    return [[b % (vocab - 1) + 1 for b in text.encode()] for text in PROMPTS]


async def closed_loop(client: Any, model: str, concurrency: int, per_client: int, max_tokens: int) -> dict[str, float]:
    """`concurrency` clients sending `per_client` requests each, back to back; their output tokens/s together."""
    prompts = prompts_for(model)

    async def worker(c: int) -> int:
        n = 0
        for k in range(per_client):
            r = await client.completions.create(model=model, prompt=prompts[(c + k) % len(prompts)],
                                                max_tokens=max_tokens, temperature=0.8, seed=1000 * c + k)
            n += r.usage.completion_tokens if r.usage is not None else 0
        return n

    t = time.perf_counter()
    tokens = sum(await asyncio.gather(*(worker(c) for c in range(concurrency))))
    seconds = time.perf_counter() - t
    return {"concurrency": concurrency, "requests": concurrency * per_client, "output_tokens": tokens,
            "seconds": seconds, "output_tokens_per_s": tokens / seconds}


async def _loops(url: str, model: str, concurrency: int, per_client: int,
                 max_tokens: int) -> tuple[dict[str, float], dict[str, float]]:
    from openai import AsyncOpenAI

    client = AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", timeout=600)
    await client.completions.create(model=model, prompt=prompts_for(model)[0], max_tokens=4)
    one = await closed_loop(client, model, 1, per_client, max_tokens)
    many = await closed_loop(client, model, concurrency, per_client, max_tokens)
    return one, many


def bench_batching(model: str = "smollm2-135m", device: str | None = None, dtype: str = "", concurrency: int = 8,
                   per_client: int = 3, max_tokens: int = 64, max_seq_len: int = 512,
                   threads: int = 0) -> dict[str, Any]:
    """One request at a time against `concurrency` at once, on one server; the record."""
    from athanor.serve.launch import ServerProcess

    if concurrency < 2 or per_client < 1 or max_tokens < 1:
        raise ConfigError("--concurrency must be at least 2, --requests-per-client and --max-tokens at least 1")
    device = default_device(device)
    dtype = default_dtype(device, dtype)
    args = ["--model", model, "--device", device, "--dtype", dtype, "--max-seqs", str(concurrency),
            "--max-seq-len", str(max_seq_len), "--threads", str(threads)]
    with tempfile.TemporaryDirectory() as tmp, ServerProcess(args, Path(tmp) / "serve.log") as server:
        one, many = asyncio.run(_loops(server.url, model, concurrency, per_client, max_tokens))
    speedup = many["output_tokens_per_s"] / one["output_tokens_per_s"]
    return {"benchmark": "serve-batching", "model": model, "dtype": dtype, **provenance(device),
            "worker_threads": threads, "max_tokens": max_tokens, "one_at_a_time": one, "concurrent": many,
            "speedup": speedup, "target_speedup": TARGET_SPEEDUP, "meets_target": speedup >= TARGET_SPEEDUP}


def summary_line(record: dict[str, Any]) -> str:
    """Both loops' output tokens/s and their ratio."""
    one, many = record["one_at_a_time"], record["concurrent"]
    return (f"{record['model']} on {record['device_name']}: one at a time {one['output_tokens_per_s']:.1f} tok/s, "
            f"concurrency {many['concurrency']} {many['output_tokens_per_s']:.1f} tok/s: {record['speedup']:.2f}x")
