"""Bounded-memory streaming summaries that `profile.py` builds a `TrafficProfile` from.

Each sketch takes numpy chunks (one `RequestChunk` at a time) so that per-row Python work
stays out of the hot path: profiling a million rows is dominated by parsing, not by these.
"""

from __future__ import annotations

from collections import OrderedDict

import numpy as np

NUM_BUCKETS = 32
"""Power-of-two buckets: bucket k holds values in [2^k, 2^(k+1)); bucket 0 also holds 0."""


def bucket_of(x: np.ndarray) -> np.ndarray:
    """Power-of-two bucket index of each non-negative integer in x."""
    x = np.maximum(np.asarray(x, dtype=np.int64), 1)
    return np.minimum(np.floor(np.log2(x)).astype(np.int64), NUM_BUCKETS - 1)


def bucket_hist(x: np.ndarray, weights: np.ndarray | None = None) -> np.ndarray:
    return np.bincount(bucket_of(x), weights=weights, minlength=NUM_BUCKETS)[:NUM_BUCKETS]


def range_bucket_hist(lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """Token-weighted histogram of the integer ranges [lo, hi) over power-of-two buckets."""
    out = np.zeros(NUM_BUCKETS)
    lo = np.maximum(lo, 1).astype(np.float64)
    hi = np.maximum(hi, 1).astype(np.float64)
    for k in range(NUM_BUCKETS):
        a, b = 2.0**k, 2.0 ** (k + 1) if k < NUM_BUCKETS - 1 else np.inf
        out[k] = np.clip(np.minimum(hi, b) - np.maximum(lo, a), 0, None).sum()
    return out


class Reservoir:
    """A uniform random sample of at most `capacity` rows of several columns (bottom-k of random keys)."""

    def __init__(self, capacity: int, num_columns: int, seed: int = 0) -> None:
        self.capacity = capacity
        self.rng = np.random.default_rng(seed)
        self.keys = np.empty(0)
        self.cols = [np.empty(0) for _ in range(num_columns)]

    def add(self, *cols: np.ndarray) -> None:
        keys = np.concatenate([self.keys, self.rng.random(len(cols[0]))])
        merged = [np.concatenate([old, np.asarray(new, dtype=np.float64)]) for old, new in zip(self.cols, cols, strict=False)]
        if len(keys) > self.capacity:
            keep = np.argpartition(keys, self.capacity)[: self.capacity]
            keep.sort()  # keeps arrival order among kept rows, which the tests rely on for windows
            keys, merged = keys[keep], [m[keep] for m in merged]
        self.keys, self.cols = keys, merged


class ConcurrencySweep:
    """Time-weighted histogram of how many requests decode at once (Little's law, in full).

    A request decodes from its arrival for `output_length * tpot_s` seconds. Arrivals come in
    order, chunk by chunk; end times still in the future are carried over in a heap, so memory
    is bounded by the concurrency, not by the trace.
    """

    def __init__(self, tpot_s: float, max_batch: int = 1 << 16) -> None:
        self.tpot_s = tpot_s
        self.max_batch = max_batch
        self.time_at = np.zeros(max_batch + 1)  # seconds spent at each concurrency
        self.pending_ends: list[float] = []
        self.last_t: float | None = None

    def add(self, t: np.ndarray, output_length: np.ndarray) -> None:
        if len(t) == 0:
            return
        t = np.maximum.accumulate(t)  # arrivals out of order by a hair count at the latest one seen
        ends = t + output_length * self.tpot_s
        horizon = float(t[-1])
        carried = np.asarray(self.pending_ends)
        all_ends = np.concatenate([carried, ends])
        due = all_ends <= horizon
        self.pending_ends = list(all_ends[~due])
        start = float(t[0]) if self.last_t is None else self.last_t
        times = np.concatenate([t, all_ends[due], [start]])
        steps = np.concatenate([np.ones(len(t)), -np.ones(int(due.sum())), [0.0]])
        order = np.argsort(times, kind="stable")
        times, steps = times[order], steps[order]
        count = len(carried) + np.cumsum(steps)  # concurrency right after each event
        durations = np.diff(np.append(times, horizon))
        idx = np.clip(count, 0, self.max_batch).astype(np.int64)
        self.time_at += np.bincount(idx, weights=np.clip(durations, 0, None), minlength=self.max_batch + 1)
        self.last_t = horizon

    def finish(self) -> np.ndarray:
        """Seconds spent at each concurrency, the tail drained after the last arrival included."""
        ends = sorted(self.pending_ends)
        t = self.last_t or 0.0
        for i, e in enumerate(ends):
            self.time_at[min(len(ends) - i, self.max_batch)] += e - t
            t = e
        self.pending_ends = []
        return self.time_at


class PrefixLRU:
    """Which prompt blocks were already seen, against an LRU of `capacity` blocks.

    A request's cached prefix is its longest run of leading blocks present in the cache
    (prefix caching stops at the first miss, as vLLM's and SGLang's do).
    """

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.cache: OrderedDict[int, None] = OrderedDict()

    def lookup_insert(self, hash_ids: list[int]) -> int:
        """Number of leading blocks of `hash_ids` already cached; all of them become most recent."""
        cache = self.cache
        hit = 0
        for h in hash_ids:
            if h in cache:
                cache.move_to_end(h)
                hit += 1
            else:
                break
        if hit < len(hash_ids):
            rest = hash_ids[hit:]
            for h in rest:  # a later block may be cached although an earlier one missed
                if h in cache:
                    cache.move_to_end(h)
            cache.update(dict.fromkeys(rest))
        while len(cache) > self.capacity:
            cache.popitem(last=False)
        return hit
