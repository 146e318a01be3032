"""`athanor bench serve`: replay a trace (or send synthetic requests) against a running server with the `openai`
client.

Request i is sent at its trace time (relative to the first request) divided by `speedup`, streamed,
with the trace's prompt length (token ids taken from real text, cut to the server's context) and
its output length as `max_tokens`. A trace with prefix block hashes (Mooncake's `hash_ids`, 512-token blocks)
gets prompts built block by block, each hash always the same 512 tokens: reuse in the trace is reuse in the
replay. Without a trace, `--random-input-len` sends synthetic requests (vLLM's random dataset): prompts of one
length cut from the same text, optionally sharing a prefix. Reported: TTFT, TPOT (mean time per output token after the
first), ITL (gaps between streamed chunks) and end-to-end latency at p50/p90/p99, throughput,
goodput (requests per second that met both the TTFT and the TPOT SLO, DistServe's definition), and the prompt
tokens the server computed against those it was sent (its prefix reuse, from its /metrics).

Progress goes to a status hook (`bench_serve(status=...)`, e.g. the command's status line) every STATUS_S seconds;
an interrupted replay (Ctrl-C) still writes its record, of the requests that finished, marked `interrupted`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import httpx
import numpy as np

from athanor.bench.record import provenance
from athanor.errors import AthanorError, ConfigError
from athanor.traffic.formats import MOONCAKE_BLOCK_TOKENS as BLOCK_TOKENS
from athanor.traffic.parsers import read_columns
from athanor.traffic.sketch import ReferencePrefixLRU

STATUS_S = 1.0
"""Seconds between status updates: a live line moves each second; summing the samples so often costs the replay
nothing (how often a plain status line is printed is the status line's own choice)."""


@dataclass(frozen=True)
class BenchOptions:
    url: str
    trace: str = ""
    """A trace file to replay; empty: synthetic requests (`random_input_len`)."""
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
    request_rate: float = 0.0
    """Requests per second as a Poisson process (vLLM's --request-rate), in place of the trace's arrival times;
    0: the trace's times divided by `speedup`."""
    seed: int = 0
    """Seeds the Poisson arrivals."""
    random_input_len: int = 0
    """Synthetic requests instead of a trace (vLLM's random dataset): `max_requests` prompts of this many tokens,
    all sent at once (or at `request_rate`), each asking for `random_output_len` tokens."""
    random_output_len: int = 128
    random_prefix_len: int = 0
    """Of each synthetic prompt, the leading tokens every prompt shares (a common system prompt)."""


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


def block_prompt(pool: list[int], hashes: list[int], n: int) -> list[int]:
    """n prompt tokens built from prefix block hashes: block h is always the same BLOCK_TOKENS tokens of `pool`
    (from an offset the hash picks), so requests that share leading hashes share leading tokens."""
    out: list[int] = []
    span = max(1, len(pool) - BLOCK_TOKENS)
    for h in hashes:
        if len(out) >= n:
            break
        offset = (h * 2654435761) % span  # Knuth's multiplicative hash: neighbouring ids land far apart
        out += pool[offset:offset + BLOCK_TOKENS]
    while len(out) < n:  # a trace whose blocks do not cover its prompt: the rest from the pool's start
        out += pool[:n - len(out)]
    return out[:n]


def lru_prefill_tokens(inputs: list[int], hashes: list[list[int]], capacity_tokens: int) -> int:
    """Prompt tokens an ideal LRU prefix cache of `capacity_tokens` would still compute for these requests, served
    one after another (`traffic.sketch.ReferencePrefixLRU` over their whole BLOCK_TOKENS blocks): each computes what
    follows its run of leading cached blocks, at least one token. The yardstick for the server's own count
    (`athanor_prefill_tokens`)."""
    lru = ReferencePrefixLRU(capacity_tokens // BLOCK_TOKENS)
    return sum(max(1, n - BLOCK_TOKENS * lru.lookup_insert(blocks[:n // BLOCK_TOKENS]))
               for n, blocks in zip(inputs, hashes, strict=True))


STEP_KINDS = ("decode", "prefill", "mixed")


async def _server_counters(url: str) -> dict[str, float]:
    """What the server counted so far, from its /metrics: "prompt" and "prefill" (prompt tokens sent, and computed
    by prefill), "pool" (tokens its KV pool holds), and per kind of step (`STEP_KINDS`) "steps.K", "seconds.K" and
    "prefill.K" (prompt tokens computed in such steps). Absent where it does not say."""
    from prometheus_client.parser import text_string_to_metric_families

    try:
        async with httpx.AsyncClient(base_url=url, timeout=10) as http:
            text = (await http.get("/metrics")).text
    except httpx.HTTPError:
        return {}
    names = {"athanor_prompt_tokens_total": "prompt", "athanor_prefill_tokens_total": "prefill",
             "athanor_kv_pool_tokens": "pool", "athanor_step_seconds_count": "steps",
             "athanor_step_seconds_sum": "seconds", "athanor_step_prefill_tokens_total": "prefill"}
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            key = names.get(sample.name)
            if key is not None:
                kind = sample.labels.get("kind")
                out[f"{key}.{kind}" if kind else key] = sample.value
    return out


def _steps(before: dict[str, float], after: dict[str, float], duration: float) -> dict[str, Any]:
    """Per kind of step over the replay: steps, seconds and prompt tokens computed, with the prompt tokens per
    second of such steps; and the worker's busy share (its steps' seconds over the replay's)."""
    def delta(key: str) -> float:
        return after.get(key, 0.0) - before.get(key, 0.0)

    kinds: dict[str, dict[str, float | None]] = {}
    busy = 0.0
    for kind in STEP_KINDS:
        seconds, tokens = delta(f"seconds.{kind}"), delta(f"prefill.{kind}")
        busy += seconds
        kinds[kind] = {"steps": delta(f"steps.{kind}"), "seconds": seconds, "prefill_tokens": tokens,
                       "prefill_tokens_per_s": tokens / seconds if seconds and tokens else None}
    return {"by_kind": kinds, "busy_share": busy / duration if duration else None}


def status_line(samples: list[Sample], total: int, elapsed_s: float) -> str:
    """Where a replay stands: requests done of `total`, failed, output tokens per second so far, seconds elapsed."""
    done = [s for s in samples if s.ok or s.error]
    out = sum(s.output_tokens for s in done if s.ok)
    return (f"{len(done)} of {total} requests done, {sum(1 for s in done if s.error)} failed, "
            f"{out / elapsed_s if elapsed_s > 0 else 0.0:.1f} output tokens/s so far, {elapsed_s:.0f} s")


async def _progress(samples: list[Sample], total: int, start: float, status: Callable[[str], None]) -> None:
    while True:
        status(status_line(samples, total, time.perf_counter() - start))
        await asyncio.sleep(STATUS_S)


def _requests(options: BenchOptions) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[list[int]]]:
    """(arrival seconds, prompt lengths, output lengths, prefix block hashes or []) of the requests to send: the
    trace's first `max_requests`, or as many synthetic ones."""
    if options.random_input_len:
        n = options.max_requests
        return (np.zeros(n), np.full(n, options.random_input_len), np.full(n, options.random_output_len), [])
    trace = read_columns(options.trace, skip_bad=True)
    n = min(options.max_requests, len(trace))
    return (trace.timestamp_s[:n] - trace.timestamp_s[0], trace.input_length[:n], trace.output_length[:n],
            trace.hash_ids or [])


async def _replay(options: BenchOptions, samples: list[Sample], blocks: list[list[int]],
                  status: Callable[[str], None]) -> tuple[float, str]:
    """Replay the trace into `samples`; `blocks` gets each request's prefix block hashes (none: []); `status` is
    told how far it is (`status_line`) every STATUS_S seconds."""
    from openai import AsyncOpenAI

    async with httpx.AsyncClient(base_url=options.url, timeout=30) as http:
        try:
            models = (await http.get("/v1/models")).json()["data"]
        except httpx.HTTPError as e:
            raise ConfigError(f"--url {options.url}: no server answers there ({type(e).__name__}); start "
                              "`athanor serve` first") from None
    model = options.model or models[0]["id"]
    context = int(models[0].get("max_model_len", 2048))
    times, inputs, outputs, hashes = _requests(options)
    n = len(times)
    if options.request_rate > 0:  # Poisson arrivals: exponential gaps, the first request at once
        gaps = np.random.default_rng(options.seed).exponential(1.0 / options.request_rate, n)
        times = np.concatenate(([0.0], np.cumsum(gaps[1:]))) * options.speedup  # `launch` divides by speedup
    pool = _token_pool(model, context + BLOCK_TOKENS)
    prefix = pool[:options.random_prefix_len]
    client = AsyncOpenAI(base_url=f"{options.url}/v1", api_key="unused", timeout=600, max_retries=0)
    gate = asyncio.Semaphore(options.concurrency)
    start = time.perf_counter()

    async def launch(i: int) -> None:
        n_out = max(1, int(outputs[i]))
        if options.max_output:
            n_out = min(n_out, options.max_output)
        n_out = min(n_out, context // 2)
        n_in = max(1, min(int(inputs[i]), context - n_out, options.max_input or context))
        sample = Sample(n_in, n_out)
        samples.append(sample)
        blocks.append(list(hashes[i]) if hashes and hashes[i] else [])
        await asyncio.sleep(max(0.0, float(times[i]) / options.speedup - (time.perf_counter() - start)))
        async with gate:
            if hashes and hashes[i]:
                prompt = block_prompt(pool, hashes[i], n_in)
            else:  # distinct prompts (after the shared prefix), from one text
                rest = max(0, n_in - len(prefix))
                offset = len(prefix) + (i * 7919) % max(1, len(pool) - len(prefix) - rest)
                prompt = (prefix + pool[offset:offset + rest])[:n_in]
            await _one(client, model, prompt, n_out, sample)

    progress = asyncio.create_task(_progress(samples, n, start, status))
    try:
        await asyncio.gather(*(launch(i) for i in range(n)))
    finally:
        progress.cancel()
    return time.perf_counter() - start, model


def bench_serve(options: BenchOptions, status: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Replay and summarise; the JSON record (with per-request samples). `status` is told how far the replay is
    (`status_line`) every STATUS_S seconds (None: nobody)."""
    if options.speedup <= 0 or options.max_requests < 1 or options.request_rate < 0:
        raise ConfigError("--speedup must be > 0, --max-requests >= 1 and --request-rate >= 0")
    if bool(options.trace) == bool(options.random_input_len):
        raise ConfigError("bench serve: give --trace FILE (replay a trace) or --random-input-len N (synthetic "
                          "requests), one of them")
    if options.random_input_len and not 0 <= options.random_prefix_len <= options.random_input_len:
        raise ConfigError(f"--random-prefix-len {options.random_prefix_len}: must lie in [0, --random-input-len "
                          f"{options.random_input_len}]")
    samples: list[Sample] = []
    blocks: list[list[int]] = []
    before = asyncio.run(_server_counters(options.url))
    start = time.perf_counter()
    interrupted = False
    try:
        duration, model = asyncio.run(_replay(options, samples, blocks, status or (lambda text: None)))
    except KeyboardInterrupt:  # the record of what finished is still worth writing
        interrupted, duration, model = True, time.perf_counter() - start, options.model
        blocks = [b for s, b in zip(samples, blocks) if s.ok or s.error]
        samples = [s for s in samples if s.ok or s.error]
    after = asyncio.run(_server_counters(options.url))
    pool = after.get("pool", float("nan"))
    prompt, prefill = (after.get(k, float("nan")) - before.get(k, float("nan")) for k in ("prompt", "prefill"))
    lru = (lru_prefill_tokens([s.input_tokens for s in samples], blocks, int(pool))
           if any(blocks) and pool == pool else None)
    ok = [s for s in samples if s.ok]
    good = [s for s in ok if s.ttft_s <= options.slo_ttft_s and (s.output_tokens <= 1 or s.tpot_s <= options.slo_tpot_s)]
    out_tokens = sum(s.output_tokens for s in ok)
    summary = {
        "requests": len(samples), "completed": len(ok), "failed": len(samples) - len(ok), "duration_s": duration,
        "output_tokens": out_tokens, "output_tokens_per_s": out_tokens / duration,
        "requests_per_s": len(ok) / duration, "goodput_requests_per_s": len(good) / duration,
        # The compile loop's objective as served: a one-GPU server's seconds per 1,000 requests of this traffic.
        "gpu_s_per_1k_requests": 1000 * duration / len(ok) if ok else None,
        "slo": {"ttft_s": options.slo_ttft_s, "tpot_s": options.slo_tpot_s},
        "ttft_s": _percentiles([s.ttft_s for s in ok]), "tpot_s": _percentiles([s.tpot_s for s in ok]),
        "itl_s": _percentiles([x for s in ok for x in s.itl_s]), "e2e_s": _percentiles([s.e2e_s for s in ok]),
        "server_prompt_tokens": prompt, "server_prefill_tokens": prefill,
        "kv_pool_tokens": pool, "lru_prefill_tokens": lru, "prefill_vs_lru": prefill / lru if lru else None,
        "server_steps": _steps(before, after, duration),
        "interrupted": interrupted,
    }
    errors = sorted({s.error for s in samples if not s.ok})[:5]
    # The provenance is the client's: the record is made where the replay ran.
    return {"benchmark": "serve", "model": model, "options": asdict(options), **provenance("cpu"), "summary": summary,
            "errors": errors,
            "samples": [{**asdict(s), "itl_s": None, "tpot_s": s.tpot_s} for s in samples]}
