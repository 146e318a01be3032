"""Continuous batching on the CPU: output tokens/s at concurrency 8 against one request at a time.

Starts `athanor serve` (smollm2-135m, CPU), then runs closed loops with the `openai` client: C clients,
each sending requests back to back (sampled, fixed seeds, `max_tokens` 64), for C = 1 and C = 8.
Writes bench/results/serve_batching_cpu.json. Target (issue 8): at least 3x.

    /tmp/venv0/bin/python bench/serve_batching.py [--threads N] [--requests-per-client K]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from pathlib import Path

from openai import AsyncOpenAI

from athanor.provenance import environment
from athanor.serve.launch import ServerProcess

MODEL = "smollm2-135m"
PROMPTS = ["Once upon a time, in a small village,", "The history of the printing press", "Write a short poem about "
           "the sea:", "Explain why the sky is blue.", "My favourite recipe for bread is", "In the year 2050, cities",
           "A letter to my younger self:", "The rules of chess are simple:"]


async def closed_loop(client: AsyncOpenAI, concurrency: int, per_client: int, max_tokens: int) -> dict[str, float]:
    async def worker(c: int) -> int:
        n = 0
        for k in range(per_client):
            r = await client.completions.create(model=MODEL, prompt=PROMPTS[(c + k) % len(PROMPTS)],
                                                max_tokens=max_tokens, temperature=0.8, seed=1000 * c + k)
            assert r.usage is not None
            n += r.usage.completion_tokens
        return n

    t = time.perf_counter()
    tokens = sum(await asyncio.gather(*(worker(c) for c in range(concurrency))))
    seconds = time.perf_counter() - t
    return {"concurrency": concurrency, "requests": concurrency * per_client, "output_tokens": tokens,
            "seconds": seconds, "output_tokens_per_s": tokens / seconds}


async def run(url: str, per_client: int, max_tokens: int) -> tuple[dict[str, float], dict[str, float]]:
    client = AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", timeout=600)
    await client.completions.create(model=MODEL, prompt="warm up", max_tokens=4)
    one = await closed_loop(client, 1, per_client, max_tokens)
    eight = await closed_loop(client, 8, per_client, max_tokens)
    return one, eight


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=0, help="CPU threads of the serving worker (0: engine default)")
    ap.add_argument("--requests-per-client", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--json", default=str(Path(__file__).parent / "results" / "serve_batching_cpu.json"))
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp, ServerProcess(
            ["--model", MODEL, "--max-seqs", "8", "--max-seq-len", "512", "--threads", str(args.threads)],
            Path(tmp) / "serve.log") as server:
        one, eight = asyncio.run(run(server.url, args.requests_per_client, args.max_tokens))
    speedup = eight["output_tokens_per_s"] / one["output_tokens_per_s"]
    record = {"benchmark": "serve_batching", "model": MODEL, "environment": environment("cpu"),
              "worker_threads": args.threads, "max_tokens": args.max_tokens, "one_at_a_time": one,
              "concurrency_8": eight, "speedup": speedup, "target_speedup": 3.0, "meets_target": speedup >= 3.0}
    out = Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record, indent=2) + "\n")
    print(f"one at a time {one['output_tokens_per_s']:.1f} tok/s, concurrency 8 {eight['output_tokens_per_s']:.1f} "
          f"tok/s: {speedup:.2f}x  -> {out}")


if __name__ == "__main__":
    main()
