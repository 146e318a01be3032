"""`athanor bench serve`: replay a trace against a running server with the `openai` client.

Request i is sent at its trace time (relative to the first request) divided by `speedup`, streamed,
with the trace's prompt length (token ids taken from real text, cut to the server's context) and
its output length as `max_tokens`. Reported: TTFT, TPOT (mean time per output token after the
first), ITL (gaps between streamed chunks) and end-to-end latency at p50/p90/p99, throughput, and
goodput: requests per second that met both the TTFT and the TPOT SLO (DistServe's definition).
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import httpx
import numpy as np

from athanor.bench.record import provenance
from athanor.errors import AthanorError, ConfigError
from athanor.traffic.parsers import read_columns

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class BenchOptions:
    url: str
    trace: str
    speedup: float = 1.0
    max_requests: int = 100
    model: str = ""
    """Empty: the server's first model."""
    max_input: int = 0
    max_output: int = 0
    slo_ttft_s: float = 2.0
    slo_tpot_s: float = 0.2
    concurrency: int = 64
    """Requests in flight at most (beyond it a request is sent late, and its lateness counts in its TTFT)."""


@dataclass
class Sample:
    input_tokens: int
    max_tokens: int
    ok: bool = False
    error: str = ""
    output_tokens: int = 0
    ttft_s: float = float("nan")
    e2e_s: float = float("nan")
    itl_s: list[float] = field(default_factory=list)

    @property
    def tpot_s(self) -> float:
        return (self.e2e_s - self.ttft_s) / (self.output_tokens - 1) if self.output_tokens > 1 else float("nan")


def _percentiles(values: list[float]) -> dict[str, float]:
    a = np.asarray([v for v in values if v == v], dtype=np.float64)
    if not len(a):
        return {"p50": float("nan"), "p90": float("nan"), "p99": float("nan"), "mean": float("nan")}
    p50, p90, p99 = np.percentile(a, [50, 90, 99])
    return {"p50": float(p50), "p90": float(p90), "p99": float(p99), "mean": float(a.mean())}


def _token_pool(model: str, n: int) -> list[int]:
    """Token ids of real text: the model's tokenizer over the corpus, or without one (a random preset) the corpus's
    bytes, as ids within its vocabulary."""
    from athanor.model.registry import load_spec, load_tokenizer
    from athanor.traffic.corpus import encoded_sentences, sentences

    try:
        flat = [t for s in encoded_sentences(load_tokenizer(model)) for t in s]
    except AthanorError:
        try:
            vocab = load_spec(model).vocab_size
        except AthanorError:  # a served name that is no model here: bytes are ids every vocabulary holds
            vocab = 257
        flat = [b % (vocab - 1) + 1 for s in sentences() for b in s.encode()]
    while len(flat) < n:
        flat = flat + flat
    return flat


async def _one(client: Any, model: str, prompt: list[int], max_tokens: int, sample: Sample) -> None:
    t0 = time.perf_counter()
    last = t0
    try:
        stream = await client.completions.create(model=model, prompt=prompt, max_tokens=max_tokens, stream=True,
                                                 temperature=0.0, stream_options={"include_usage": True})
        async for chunk in stream:
            now = time.perf_counter()
            if chunk.choices and chunk.choices[0].text:
                if sample.ttft_s != sample.ttft_s:
                    sample.ttft_s = now - t0
                else:
                    sample.itl_s.append(now - last)
                last = now
            if chunk.usage is not None:
                sample.output_tokens = chunk.usage.completion_tokens
        sample.e2e_s = time.perf_counter() - t0
        sample.ok = True
    except Exception as e:  # a failed request is a figure of the benchmark, not its end
        sample.error = f"{type(e).__name__}: {e}"[:300]


async def _replay(options: BenchOptions) -> tuple[list[Sample], float, str]:
    from openai import AsyncOpenAI

    async with httpx.AsyncClient(base_url=options.url, timeout=30) as http:
        models = (await http.get("/v1/models")).json()["data"]
    model = options.model or models[0]["id"]
    context = int(models[0].get("max_model_len", 2048))
    trace = read_columns(options.trace, skip_bad=True)
    n = min(options.max_requests, len(trace))
    times = trace.timestamp_s[:n] - trace.timestamp_s[0]
    pool = _token_pool(model, context)
    samples: list[Sample] = []
    client = AsyncOpenAI(base_url=f"{options.url}/v1", api_key="unused", timeout=600, max_retries=0)
    gate = asyncio.Semaphore(options.concurrency)
    start = time.perf_counter()

    async def launch(i: int) -> None:
        n_out = max(1, int(trace.output_length[i]))
        if options.max_output:
            n_out = min(n_out, options.max_output)
        n_out = min(n_out, context // 2)
        n_in = max(1, min(int(trace.input_length[i]), context - n_out, options.max_input or context))
        sample = Sample(n_in, n_out)
        samples.append(sample)
        await asyncio.sleep(max(0.0, float(times[i]) / options.speedup - (time.perf_counter() - start)))
        async with gate:
            offset = (i * 7919) % max(1, len(pool) - n_in)
            await _one(client, model, pool[offset:offset + n_in], n_out, sample)

    await asyncio.gather(*(launch(i) for i in range(n)))
    return samples, time.perf_counter() - start, model


def bench_serve(options: BenchOptions) -> dict[str, Any]:
    """Replay and summarise; the JSON record (with per-request samples)."""
    if options.speedup <= 0 or options.max_requests < 1:
        raise ConfigError("--speedup must be > 0 and --max-requests >= 1")
    samples, duration, model = asyncio.run(_replay(options))
    ok = [s for s in samples if s.ok]
    good = [s for s in ok if s.ttft_s <= options.slo_ttft_s and (s.output_tokens <= 1 or s.tpot_s <= options.slo_tpot_s)]
    out_tokens = sum(s.output_tokens for s in ok)
    summary = {
        "requests": len(samples), "completed": len(ok), "failed": len(samples) - len(ok), "duration_s": duration,
        "output_tokens": out_tokens, "output_tokens_per_s": out_tokens / duration,
        "requests_per_s": len(ok) / duration, "goodput_requests_per_s": len(good) / duration,
        "slo": {"ttft_s": options.slo_ttft_s, "tpot_s": options.slo_tpot_s},
        "ttft_s": _percentiles([s.ttft_s for s in ok]), "tpot_s": _percentiles([s.tpot_s for s in ok]),
        "itl_s": _percentiles([x for s in ok for x in s.itl_s]), "e2e_s": _percentiles([s.e2e_s for s in ok]),
    }
    errors = sorted({s.error for s in samples if not s.ok})[:5]
    # The provenance is the client's: the record is made where the replay ran.
    return {"benchmark": "serve", "model": model, "options": asdict(options), **provenance("cpu"), "summary": summary,
            "errors": errors,
            "samples": [{**asdict(s), "itl_s": None, "tpot_s": s.tpot_s} for s in samples]}
