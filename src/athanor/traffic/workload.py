"""`Workload`: what a stream of requests costs an engine, and concrete requests to replay.

(a) Step counts per 1,000 requests: prefill chunks (length, cached context) and decode steps
    (batch size, typical context length). Counts, not times: the evaluator prices each step by
    its measured time, and the sum is the objective, projected GPU-seconds per 1,000 requests
    (docs/architecture.md).
(b) Replay requests: token ids of the profile's lengths, sharing prefixes exactly as `hash_ids`
    say (equal block ids give equal token blocks), with content from real text (`corpus.py`).
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass

import numpy as np

from athanor.traffic.chunk import RequestChunk
from athanor.traffic.corpus import Tokenizer, encoded_sentences
from athanor.traffic.formats import MOONCAKE_BLOCK_TOKENS
from athanor.traffic.profile import TrafficProfile

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PrefillStep:
    """`count` prefill chunks of `chunk_len` new tokens on top of `context_len` cached ones (both
    rounded up to a power of two)."""

    chunk_len: int
    context_len: int
    count: float


@dataclass(frozen=True)
class DecodeStep:
    """`count` decode steps of `batch_size` sequences whose mean context rounds up to `context_len`."""

    batch_size: int
    context_len: int
    count: float


@dataclass(frozen=True)
class Workload:
    """Steps per `per_requests` requests of one profile at one per-token latency."""

    profile_source: str
    per_requests: int
    tpot_s: float
    chunk_size: int
    max_batch: int
    prefill: tuple[PrefillStep, ...]
    decode: tuple[DecodeStep, ...]
    prefill_tokens: float
    """New (uncached) prompt tokens per `per_requests` requests."""
    decode_tokens: float

    @property
    def num_prefill_steps(self) -> float:
        return sum(s.count for s in self.prefill)

    @property
    def num_decode_steps(self) -> float:
        return sum(s.count for s in self.decode)

    def mean_decode_batch(self) -> float:
        return self.decode_tokens / max(self.num_decode_steps, 1e-12)


def _pow2_ceil(x: np.ndarray) -> np.ndarray:
    return (2 ** np.ceil(np.log2(np.maximum(x, 1)))).astype(np.int64)


def synthesize_requests(profile: TrafficProfile, num_requests: int, seed: int = 0) -> RequestChunk:
    """Requests drawn from `profile`: (input, output) pairs resampled jointly from its sample,
    inter-arrival times from its gamma fit (Poisson at its rate when the fit is degenerate)."""
    rng = np.random.default_rng(seed)
    n_sample = len(profile.sample.input_length)
    if n_sample == 0:
        raise ValueError(f"profile {profile.source} has no request sample to synthesize from")
    pick = rng.integers(0, n_sample, num_requests)
    n_in = np.asarray(profile.sample.input_length, dtype=np.int64)[pick]
    n_out = np.asarray(profile.sample.output_length, dtype=np.int64)[pick]
    a = profile.arrivals
    if a.gamma_shape > 0 and a.gamma_scale_s > 0:
        gaps = rng.gamma(a.gamma_shape, a.gamma_scale_s, num_requests)
    else:
        gaps = rng.exponential(1.0 / max(a.rate_rps, 1e-9), num_requests)
    return RequestChunk(np.cumsum(gaps) - gaps[0], n_in, n_out)


def workload_from_profile(profile: TrafficProfile, chunk_size: int = 2048, tpot_s: float | None = None,
                          max_batch: int = 256, num_requests: int = 4000, per_requests: int = 1000,
                          seed: int = 0) -> Workload:
    """Step counts per `per_requests` requests (see the module docstring).

    Decode: each request decodes one token per step from its arrival on (prefill time is
    neglected next to decode time); a step's batch is every sequence decoding in it, split into
    steps of at most `max_batch`. Prefill: the uncached part of each prompt (the profile's prefix
    hit share) in chunks of at most `chunk_size` tokens.
    """
    tpot = tpot_s if tpot_s is not None else profile.decode.tpot_s
    reqs = synthesize_requests(profile, num_requests, seed)
    scale = per_requests / num_requests
    hit_share = profile.prefix.hit_share if profile.prefix is not None else 0.0

    # Prefill chunks.
    cached = np.floor(reqs.input_length * hit_share).astype(np.int64)
    new = reqs.input_length - cached
    prefill: Counter[tuple[int, int]] = Counter()
    for c, n in zip(cached.tolist(), new.tolist(), strict=False):
        done = 0
        while done < n:
            step = min(chunk_size, n - done)
            prefill[(int(_pow2_ceil(np.array(step))), int(_pow2_ceil(np.array(c + done))) if c + done else 0)] += 1
            done += step

    # Decode steps: token j of request i runs in step s_i + j with context input_i + j.
    n_out = reqs.output_length
    first_step = np.floor(reqs.timestamp_s / tpot).astype(np.int64)
    total = int(n_out.sum())
    owner = np.repeat(np.arange(len(n_out)), n_out)
    j = np.arange(total) - np.repeat(np.cumsum(n_out) - n_out, n_out)
    step_of = first_step[owner] + j
    ctx = reqs.input_length[owner] + j
    num_steps = int(step_of.max()) + 1 if total else 0
    batch = np.bincount(step_of, minlength=num_steps)
    ctx_sum = np.bincount(step_of, weights=ctx, minlength=num_steps)
    live = batch > 0
    batch, ctx_sum = batch[live], ctx_sum[live]
    ctx_bucket = _pow2_ceil(ctx_sum / batch)
    decode: Counter[tuple[int, int]] = Counter()
    for b, c in zip(batch.tolist(), ctx_bucket.tolist(), strict=False):
        full, rest = divmod(b, max_batch)
        if full:
            decode[(max_batch, c)] += full
        if rest:
            decode[(rest, c)] += 1
    return Workload(
        profile_source=profile.source, per_requests=per_requests, tpot_s=tpot, chunk_size=chunk_size,
        max_batch=max_batch,
        prefill=tuple(PrefillStep(k[0], k[1], v * scale) for k, v in sorted(prefill.items())),
        decode=tuple(DecodeStep(k[0], k[1], v * scale) for k, v in sorted(decode.items())),
        prefill_tokens=float(new.sum()) * scale, decode_tokens=float(total) * scale,
    )


@dataclass(frozen=True)
class ReplayRequest:
    """One request to send: prompt token ids, how many tokens to generate, when (s from start)."""

    arrival_s: float
    prompt_ids: tuple[int, ...]
    max_new_tokens: int
    hash_ids: tuple[int, ...] = ()


class BlockText:
    """Token blocks of real text, one per block hash: equal hashes give equal blocks, different
    hashes (almost surely) different ones, since each starts at its own sentence of a shuffled order."""

    def __init__(self, tokenizer: Tokenizer, block_tokens: int, seed: int = 0) -> None:
        self.sentences = encoded_sentences(tokenizer)
        if not self.sentences:
            raise ValueError("the tokenizer encodes the corpus to nothing")
        self.block_tokens = block_tokens
        self.seed = seed
        self._blocks: dict[int, list[int]] = {}

    def block(self, hash_id: int) -> list[int]:
        got = self._blocks.get(hash_id)
        if got is None:
            rng = np.random.default_rng([self.seed, hash_id & 0xFFFFFFFFFFFF])
            ids: list[int] = []
            while len(ids) < self.block_tokens:
                ids.extend(self.sentences[int(rng.integers(len(self.sentences)))])
            got = self._blocks[hash_id] = ids[: self.block_tokens]
        return got


def _synthetic_hash_ids(n_in: np.ndarray, hit_share: float, block_tokens: int, rng: np.random.Generator,
                        num_shared_prefixes: int = 8) -> list[list[int]]:
    """Block ids giving about `hit_share` of prompt tokens in shared leading blocks (a few system prompts)."""
    next_id = num_shared_prefixes << 20
    out = []
    for n in n_in.tolist():
        num_blocks = -(-n // block_tokens)
        shared = min(num_blocks, round(hit_share * n / block_tokens))
        chain = int(rng.integers(num_shared_prefixes)) << 20
        ids = [chain + k for k in range(shared)] + list(range(next_id, next_id + num_blocks - shared))
        next_id += num_blocks - shared
        out.append(ids)
    return out


def replay_requests(source: TrafficProfile | RequestChunk, tokenizer: Tokenizer, num_requests: int = 256,
                    seed: int = 0, block_tokens: int = MOONCAKE_BLOCK_TOKENS,
                    max_input_len: int | None = None, max_output_len: int | None = None) -> list[ReplayRequest]:
    """Concrete requests: a trace's first `num_requests` rows (with its `hash_ids`), or requests
    synthesized from a profile (prefix sharing at its hit share). Lengths are clamped to
    `max_input_len` / `max_output_len` when given (small models have short context windows)."""
    rng = np.random.default_rng(seed)
    if isinstance(source, TrafficProfile):
        rows = synthesize_requests(source, num_requests, seed)
        share = source.prefix.hit_share if source.prefix is not None else 0.0
        hashes = _synthetic_hash_ids(rows.input_length, share, block_tokens, rng)
    else:
        n = min(num_requests, len(source))
        rows = RequestChunk(source.timestamp_s[:n] - source.timestamp_s[0], source.input_length[:n],
                            source.output_length[:n])
        hashes = (source.hash_ids or [[] for _ in range(n)])[:n]
        if source.hash_ids is None:
            hashes = _synthetic_hash_ids(rows.input_length, 0.0, block_tokens, rng)
    text = BlockText(tokenizer, block_tokens, seed)
    out: list[ReplayRequest] = []
    for t, n_in, n_out, h in zip(rows.timestamp_s.tolist(), rows.input_length.tolist(),
                                 rows.output_length.tolist(), hashes, strict=False):
        if max_input_len is not None:
            n_in = min(n_in, max_input_len)
        if max_output_len is not None:
            n_out = min(n_out, max_output_len)
        n_in = max(n_in, 1)
        ids: list[int] = []
        for hid in h:
            if len(ids) >= n_in:
                break
            ids.extend(text.block(hid))
        k = 0
        while len(ids) < n_in:  # more tokens than blocks named: unique filler of real text
            ids.extend(text.block(-(len(out) << 16) - k - 1))
            k += 1
        out.append(ReplayRequest(float(t), tuple(ids[:n_in]), max(int(n_out), 1), tuple(h)))
    return out
