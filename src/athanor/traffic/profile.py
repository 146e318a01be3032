"""`TrafficProfile`: what athanor knows about a deployment's requests.

Built in one streaming pass over a trace (`profile_trace`) or from a preset
(`load_profile("preset:chat")`). Frozen and JSON-serialisable (`to_dict` / `from_dict`), so it
crosses process boundaries and lands in the store as a traffic snapshot. It carries a bounded
uniform sample of requests for the two-sample tests of `drift.py` and the workload synthesis of
`workload.py`.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from scipy import stats

from athanor.errors import ConfigError
from athanor.traffic.chunk import RequestChunk
from athanor.traffic.formats import MOONCAKE_BLOCK_TOKENS
from athanor.traffic.parsers import TraceReader
from athanor.traffic.sketch import (
    NUM_BUCKETS,
    ConcurrencySweep,
    PrefixLRU,
    Reservoir,
    bucket_hist,
    range_bucket_hist,
)

log = logging.getLogger(__name__)

DEFAULT_TPOT_S = 0.03
"""Per-token decode latency assumed for Little's law when none is given (30 ms, a typical SLO)."""


@dataclass(frozen=True)
class LengthStats:
    """A token-length distribution (prompt or output)."""

    count: int
    mean: float
    p50: float
    p90: float
    p99: float
    max: int
    hist: tuple[int, ...]
    """Requests per power-of-two bucket (bucket k: [2^k, 2^(k+1)))."""
    token_hist: tuple[int, ...]
    """Tokens per power-of-two bucket: where the work lands, which is what the engine's shapes see."""


@dataclass(frozen=True)
class ArrivalStats:
    """Request arrivals: rate and burstiness."""

    rate_rps: float
    mean_interarrival_s: float
    cv: float
    """Coefficient of variation of inter-arrival times (1 for Poisson, > 1 bursty)."""
    gamma_shape: float
    gamma_scale_s: float
    """Gamma fit of inter-arrival times (method of moments: robust to the zero gaps of ms timestamps)."""


@dataclass(frozen=True)
class PrefixStats:
    """Prefix sharing from `hash_ids`, against an LRU of `cache_blocks` blocks."""

    block_tokens: int
    cache_blocks: int
    hit_share: float
    """Share of prompt tokens in leading blocks already cached."""
    requests_with_hashes: int


@dataclass(frozen=True)
class DecodeLoad:
    """The decode batch sizes and context lengths a trace implies at `tpot_s` per token (Little's law)."""

    tpot_s: float
    mean_batch: float
    p50_batch: float
    p90_batch: float
    p99_batch: float
    batch_hist: tuple[float, ...]
    """Share of decode steps per power-of-two batch-size bucket."""
    context_hist: tuple[float, ...]
    """Decode tokens per power-of-two context-length bucket (sum = decode tokens)."""


@dataclass(frozen=True)
class RequestSample:
    """A uniform sample of requests (arrival order kept): what two-sample tests and synthesis use."""

    timestamp_s: tuple[float, ...]
    input_length: tuple[int, ...]
    output_length: tuple[int, ...]


@dataclass(frozen=True)
class TrafficProfile:
    """Everything athanor uses about a request stream."""

    source: str
    num_requests: int
    start_s: float
    duration_s: float
    arrivals: ArrivalStats
    input: LengthStats
    output: LengthStats
    decode: DecodeLoad
    sample: RequestSample
    prefix: PrefixStats | None = None
    num_skipped: int = 0
    window_s: float | None = None
    windows: tuple[TrafficProfile, ...] = field(default=())
    """Per-window profiles over time (each without windows of its own)."""

    def to_dict(self) -> dict[str, Any]:
        """The fields, and `hist_edges`: the lower edge of each bucket of every `*hist` list (powers of two; the
        first also holds 0), so the JSON reads without this code."""
        return {**dataclasses.asdict(self), "hist_edges": [0, *(2**k for k in range(1, NUM_BUCKETS))]}

    def to_json(self, indent: int | None = None) -> str:
        return json.dumps(self.to_dict(), indent=indent)

    @staticmethod
    def from_dict(d: dict[str, Any]) -> TrafficProfile:
        def tup(x: dict[str, Any]) -> dict[str, Any]:
            return {k: tuple(v) if isinstance(v, list) else v for k, v in x.items()}

        return TrafficProfile(
            source=d["source"], num_requests=d["num_requests"], start_s=d["start_s"], duration_s=d["duration_s"],
            arrivals=ArrivalStats(**d["arrivals"]), input=LengthStats(**tup(d["input"])),
            output=LengthStats(**tup(d["output"])), decode=DecodeLoad(**tup(d["decode"])),
            sample=RequestSample(**tup(d["sample"])),
            prefix=PrefixStats(**d["prefix"]) if d.get("prefix") else None,
            num_skipped=d.get("num_skipped", 0), window_s=d.get("window_s"),
            windows=tuple(TrafficProfile.from_dict(w) for w in d.get("windows", ())),
        )

    def summary(self) -> str:
        """A few readable lines (the CLI's default output)."""
        a, i, o, dl = self.arrivals, self.input, self.output, self.decode
        lines = [
            f"{self.source}: {self.num_requests:,} requests over {self.duration_s:,.0f} s "
            f"({a.rate_rps:.2f} req/s, inter-arrival CV {a.cv:.2f})",
            f"  input tokens   mean {i.mean:,.0f}  p50 {i.p50:,.0f}  p90 {i.p90:,.0f}  p99 {i.p99:,.0f}  max {i.max:,}",
            f"  output tokens  mean {o.mean:,.0f}  p50 {o.p50:,.0f}  p90 {o.p90:,.0f}  p99 {o.p99:,.0f}  max {o.max:,}",
            f"  decode batch at {dl.tpot_s * 1000:.0f} ms/token: mean {dl.mean_batch:.1f}  p50 {dl.p50_batch:.0f}  "
            f"p90 {dl.p90_batch:.0f}  p99 {dl.p99_batch:.0f}",
        ]
        if self.prefix is not None:
            p = self.prefix
            lines.append(f"  prefix sharing: {p.hit_share:.1%} of prompt tokens in cached {p.block_tokens}-token "
                         f"blocks (LRU of {p.cache_blocks:,} blocks)")
        if self.num_skipped:
            lines.append(f"  skipped {self.num_skipped:,} malformed rows")
        for k, w in enumerate(self.windows):
            lines.append(f"  window {k} (+{w.start_s - self.start_s:,.0f} s): {w.num_requests:,} req, "
                         f"{w.arrivals.rate_rps:.2f} req/s, input mean {w.input.mean:,.0f} p50 {w.input.p50:,.0f}, "
                         f"output mean {w.output.mean:,.0f}")
        return "\n".join(lines)


class _Accumulator:
    """Streaming state for one profile (the whole trace, or one window)."""

    def __init__(self, tpot_s: float, sample_size: int, seed: int) -> None:
        self.n = 0
        self.sum_in = self.sum_out = 0.0
        self.max_in = self.max_out = 0
        self.hist_in = np.zeros(NUM_BUCKETS)
        self.hist_out = np.zeros(NUM_BUCKETS)
        self.tok_in = np.zeros(NUM_BUCKETS)
        self.tok_out = np.zeros(NUM_BUCKETS)
        self.ctx_hist = np.zeros(NUM_BUCKETS)
        self.first_t: float | None = None
        self.last_t = 0.0
        self.gap_sum = self.gap_sq = 0.0
        self.num_gaps = 0
        self.gaps = Reservoir(sample_size, 1, seed + 1)
        self.sample = Reservoir(sample_size, 3, seed)
        self.sweep = ConcurrencySweep(tpot_s)
        self.hit_tokens = self.hashed_tokens = 0.0
        self.hashed_requests = 0

    def add(self, t: np.ndarray, n_in: np.ndarray, n_out: np.ndarray, hit_tokens: np.ndarray | None) -> None:
        if len(t) == 0:
            return
        prev = self.last_t if self.first_t is not None else t[0]
        if self.first_t is None:
            self.first_t = float(t[0])
        gaps = np.clip(np.diff(np.concatenate([[prev], t])), 0, None)
        if self.n == 0:
            gaps = gaps[1:]
        self.gap_sum += float(gaps.sum())
        self.gap_sq += float((gaps**2).sum())
        self.num_gaps += len(gaps)
        self.gaps.add(gaps)
        self.last_t = max(self.last_t, float(t.max()))
        self.n += len(t)
        self.sum_in += float(n_in.sum())
        self.sum_out += float(n_out.sum())
        self.max_in = max(self.max_in, int(n_in.max()))
        self.max_out = max(self.max_out, int(n_out.max()))
        self.hist_in += bucket_hist(n_in)
        self.hist_out += bucket_hist(n_out)
        self.tok_in += bucket_hist(n_in, n_in.astype(np.float64))
        self.tok_out += bucket_hist(n_out, n_out.astype(np.float64))
        self.ctx_hist += range_bucket_hist(n_in, n_in + n_out)
        self.sample.add(t, n_in, n_out)
        self.sweep.add(t, n_out)
        if hit_tokens is not None:
            self.hit_tokens += float(hit_tokens.sum())
            self.hashed_tokens += float(n_in.sum())
            self.hashed_requests += len(t)

    def finish(self, source: str, prefix_cfg: tuple[int, int] | None, window_s: float | None = None,
               duration_s: float | None = None, windows: tuple[TrafficProfile, ...] = ()) -> TrafficProfile:
        first = self.first_t or 0.0
        duration = duration_s if duration_s is not None else self.last_t - first
        s_t, s_in, s_out = self.sample.cols
        mean_gap = self.gap_sum / max(self.num_gaps, 1)
        var_gap = max(self.gap_sq / max(self.num_gaps, 1) - mean_gap**2, 0.0)
        cv = float(np.sqrt(var_gap) / mean_gap) if mean_gap > 0 else 0.0
        shape, scale = _gamma_fit(self.gaps.cols[0])
        time_at = self.sweep.finish()
        busy = time_at.copy()
        busy[0] = 0.0  # steps happen only while something decodes
        p50b, p90b, p99b = _weighted_quantiles(np.arange(len(busy)), busy, (0.5, 0.9, 0.99))
        batch_share = bucket_hist(np.arange(1, len(busy)), busy[1:])
        prefix = None
        if prefix_cfg is not None and self.hashed_requests:
            prefix = PrefixStats(prefix_cfg[0], prefix_cfg[1], self.hit_tokens / max(self.hashed_tokens, 1.0),
                                 self.hashed_requests)
        return TrafficProfile(
            source=source, num_requests=self.n, start_s=first, duration_s=float(duration),
            arrivals=ArrivalStats(self.n / duration if duration > 0 else 0.0, mean_gap, cv, shape, scale),
            input=_length_stats(self.n, self.sum_in, self.max_in, s_in, self.hist_in, self.tok_in),
            output=_length_stats(self.n, self.sum_out, self.max_out, s_out, self.hist_out, self.tok_out),
            decode=DecodeLoad(self.sweep.tpot_s, float((np.arange(len(busy)) * busy).sum() / max(busy.sum(), 1e-12)),
                              p50b, p90b, p99b, tuple(_share(batch_share)), tuple(float(x) for x in self.ctx_hist)),
            sample=RequestSample(tuple(float(x) for x in s_t), tuple(int(x) for x in s_in), tuple(int(x) for x in s_out)),
            prefix=prefix, window_s=window_s, windows=windows,
        )


def _share(x: np.ndarray) -> list[float]:
    total = x.sum()
    return [float(v / total) if total > 0 else 0.0 for v in x]


def _weighted_quantiles(values: np.ndarray, weights: np.ndarray, qs: tuple[float, ...]) -> list[float]:
    total = weights.sum()
    if total <= 0:
        return [0.0 for _ in qs]
    cdf = np.cumsum(weights) / total
    return [float(values[min(int(np.searchsorted(cdf, q)), len(values) - 1)]) for q in qs]


def _gamma_fit(gaps: np.ndarray) -> tuple[float, float]:
    if len(gaps) < 2 or gaps.mean() <= 0 or gaps.std() <= 0:
        return 0.0, 0.0
    shape, _, scale = stats.gamma.fit(gaps, floc=0, method="MM")
    return float(shape), float(scale)


def _length_stats(n: int, total: float, max_v: int, sample: np.ndarray, hist: np.ndarray,
                  tokens: np.ndarray) -> LengthStats:
    p50, p90, p99 = (float(np.quantile(sample, q)) if len(sample) else 0.0 for q in (0.5, 0.9, 0.99))
    return LengthStats(n, total / max(n, 1), p50, p90, p99, max_v, tuple(int(x) for x in hist),
                       tuple(int(x) for x in tokens))


def parse_window(text: str) -> float:
    """Seconds in a window spec such as `600`, `90s`, `10m`, `1h`."""
    units = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
    t = text.strip().lower()
    try:
        seconds = float(t[:-1]) * units[t[-1]] if t and t[-1] in units else float(t)
    except ValueError:
        raise ConfigError(f"--window {text!r}: not a duration: write e.g. 600, 90s, 10m or 1h") from None
    if seconds <= 0:
        raise ConfigError(f"--window {text!r}: must be positive")
    return seconds


def profile_chunks(chunks: Any, source: str, window_s: float | None = None, tpot_s: float = DEFAULT_TPOT_S,
                   block_tokens: int = MOONCAKE_BLOCK_TOKENS, cache_blocks: int = 1 << 16,
                   sample_size: int = 20000, window_sample_size: int = 4096, seed: int = 0) -> TrafficProfile:
    """Profile an iterable of `RequestChunk`s in one pass, with memory bounded by the sample sizes."""
    whole = _Accumulator(tpot_s, sample_size, seed)
    wins: dict[int, _Accumulator] = {}
    lru = PrefixLRU(cache_blocks)
    has_hashes = False
    t0: float | None = None
    for chunk in chunks:
        assert isinstance(chunk, RequestChunk)
        hit = None
        if chunk.block_hashes is not None and chunk.block_offsets is not None:
            has_hashes = True
            blocks = lru.lookup_insert_many(chunk.block_hashes, chunk.block_offsets)
            hit = np.minimum(blocks * block_tokens, chunk.input_length).astype(np.float64)
        whole.add(chunk.timestamp_s, chunk.input_length, chunk.output_length, hit)
        if window_s is None or len(chunk) == 0:
            continue
        if t0 is None:
            t0 = float(chunk.timestamp_s[0])
        idx = ((chunk.timestamp_s - t0) // window_s).astype(np.int64)
        for w in np.unique(idx):
            m = idx == w
            acc = wins.setdefault(int(w), _Accumulator(tpot_s, window_sample_size, seed + int(w) + 7))
            acc.add(chunk.timestamp_s[m], chunk.input_length[m], chunk.output_length[m],
                    None if hit is None else hit[m])
    if whole.n == 0:
        raise ConfigError(f"{source}: no requests to profile")
    prefix_cfg = (block_tokens, cache_blocks) if has_hashes else None
    windows: tuple[TrafficProfile, ...] = ()
    if window_s is not None:
        assert t0 is not None
        end = whole.last_t
        windows = tuple(
            wins[w].finish(f"{source}#window{w}", prefix_cfg,
                           duration_s=min(window_s, end - (t0 + w * window_s)) or window_s)
            for w in sorted(wins)
        )
    return whole.finish(source, prefix_cfg, window_s, windows=windows)


def profile_trace(path: str | Path, window_s: float | None = None, format: str | None = None,
                  skip_bad: bool = False, tpot_s: float = DEFAULT_TPOT_S, cache_blocks: int = 1 << 16,
                  sample_size: int = 20000) -> TrafficProfile:
    """Profile a trace file in one streaming pass (see `formats` for the formats)."""
    reader = TraceReader(path, format, skip_bad)
    block_tokens = MOONCAKE_BLOCK_TOKENS
    prof = profile_chunks(reader, str(path), window_s, tpot_s, block_tokens, cache_blocks, sample_size)
    if reader.num_skipped:
        log.warning("%s: skipped %d malformed rows", path, reader.num_skipped)
    return dataclasses.replace(prof, num_skipped=reader.num_skipped)


def load_profile(spec: str, window_s: float | None = None, **kwargs: Any) -> TrafficProfile:
    """A profile from `preset:NAME`, a saved profile JSON (`athanor traffic profile --json`) or a trace file."""
    if spec.startswith("preset:"):
        from athanor.traffic.presets import preset_profile

        return preset_profile(spec.removeprefix("preset:"))
    path = Path(spec)
    if path.suffix == ".json" and path.is_file():
        try:
            return TrafficProfile.from_dict(json.loads(path.read_text()))
        except (json.JSONDecodeError, KeyError, TypeError) as e:
            raise ConfigError(f"{path}: not a saved traffic profile ({e}): "
                              "write one with `athanor traffic profile FILE --json`") from None
    return profile_trace(path, window_s=window_s, **kwargs)
