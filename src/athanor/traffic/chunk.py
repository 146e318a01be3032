"""`RequestChunk`: a run of a trace's requests as numpy columns, what every parser yields.

Consumers (`profile`, `drift`, `workload`, `presets`) read the columns; block hashes travel as one
flat array plus offsets (`block_hashes`, `block_offsets`), not as Python lists. `ColumnBuffer` turns
the per-row parser's rows into a chunk.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class RequestChunk:
    """Up to `chunk_rows` consecutive requests of one trace, as columns (CPU numpy)."""

    timestamp_s: np.ndarray  # [N] float64, seconds (absolute or relative to the trace start)
    input_length: np.ndarray  # [N] int64 prompt tokens
    output_length: np.ndarray  # [N] int64 generated tokens
    block_hashes: np.ndarray | None = None
    """[B] int64: every request's prefix block hashes, concatenated (None when the format has none)."""
    block_offsets: np.ndarray | None = None
    """[N+1] int64: request i's blocks are block_hashes[block_offsets[i]:block_offsets[i+1]]."""
    ttft_s: np.ndarray | None = None  # [N] float64, NaN where unknown
    latency_s: np.ndarray | None = None  # [N] float64, NaN where unknown

    def __len__(self) -> int:
        return len(self.input_length)

    @property
    def hash_ids(self) -> list[list[int]] | None:
        """Prefix block hashes per request, as lists (for small chunks: replay, tests)."""
        if self.block_hashes is None or self.block_offsets is None:
            return None
        flat, off = self.block_hashes.tolist(), self.block_offsets.tolist()
        return [flat[a:b] for a, b in itertools.pairwise(off)]

    def rows(self, start: int, stop: int) -> RequestChunk:
        """Requests start..stop-1."""
        hashes = offsets = None
        if self.block_hashes is not None and self.block_offsets is not None:
            a, b = int(self.block_offsets[start]), int(self.block_offsets[stop])
            hashes, offsets = self.block_hashes[a:b], self.block_offsets[start:stop + 1] - a
        return RequestChunk(
            self.timestamp_s[start:stop], self.input_length[start:stop], self.output_length[start:stop], hashes,
            offsets, None if self.ttft_s is None else self.ttft_s[start:stop],
            None if self.latency_s is None else self.latency_s[start:stop],
        )

    def take(self, order: np.ndarray) -> RequestChunk:
        """The requests in `order` (indices [N'] into this chunk), their prefix blocks with them."""
        hashes = offsets = None
        if self.block_hashes is not None and self.block_offsets is not None:
            starts, lens = self.block_offsets[:-1][order], np.diff(self.block_offsets)[order]
            offsets = np.concatenate((np.zeros(1, dtype=np.int64), np.cumsum(lens)))
            hashes = self.block_hashes[np.repeat(starts - offsets[:-1], lens) + np.arange(offsets[-1])]
        return RequestChunk(
            self.timestamp_s[order], self.input_length[order], self.output_length[order], hashes, offsets,
            None if self.ttft_s is None else self.ttft_s[order],
            None if self.latency_s is None else self.latency_s[order],
        )

    @staticmethod
    def concat(chunks: list[RequestChunk]) -> RequestChunk:
        def cat(xs: list[np.ndarray | None]) -> np.ndarray | None:
            arrays = [x for x in xs if x is not None]
            return np.concatenate(arrays) if len(arrays) == len(xs) else None

        hashes: np.ndarray | None = None
        offsets: np.ndarray | None = None
        pairs = [(c.block_hashes, c.block_offsets) for c in chunks]
        if all(h is not None and o is not None for h, o in pairs):
            hashes = np.concatenate([h for h, _ in pairs if h is not None])
            parts, base = [np.zeros(1, dtype=np.int64)], 0
            for h, o in pairs:
                assert h is not None and o is not None
                parts.append(o[1:] + base)
                base += len(h)
            offsets = np.concatenate(parts)
        return RequestChunk(
            np.concatenate([c.timestamp_s for c in chunks]), np.concatenate([c.input_length for c in chunks]),
            np.concatenate([c.output_length for c in chunks]), hashes, offsets,
            cat([c.ttft_s for c in chunks]), cat([c.latency_s for c in chunks]),
        )


def hash_csr(hash_ids: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
    """(block_hashes, block_offsets) of per-request lists of block hashes."""
    offsets = np.zeros(len(hash_ids) + 1, dtype=np.int64)
    np.cumsum([len(h) for h in hash_ids], out=offsets[1:])
    flat = np.fromiter((x for h in hash_ids for x in h), dtype=np.int64, count=int(offsets[-1]))
    return flat, offsets


class ColumnBuffer:
    """Rows of a per-row parser, buffered until they become a `RequestChunk` (`flush`)."""

    def __init__(self, with_hashes: bool, with_latency: bool) -> None:
        self.with_hashes, self.with_latency = with_hashes, with_latency
        self._reset()

    def _reset(self) -> None:
        self.t: list[float] = []
        self.n_in: list[int] = []
        self.n_out: list[int] = []
        self.hashes: list[list[int]] = []
        self.ttft: list[float] = []
        self.lat: list[float] = []

    def __len__(self) -> int:
        return len(self.t)

    def add(self, t: float, n_in: int, n_out: int, hashes: list[int] | None,
            ttft: float | None, lat: float | None) -> None:
        self.t.append(t)
        self.n_in.append(n_in)
        self.n_out.append(n_out)
        if self.with_hashes:
            self.hashes.append(hashes or [])
        if self.with_latency:
            self.ttft.append(float("nan") if ttft is None else ttft)
            self.lat.append(float("nan") if lat is None else lat)

    def flush(self) -> RequestChunk:
        hashes, offsets = hash_csr(self.hashes) if self.with_hashes else (None, None)
        chunk = RequestChunk(
            np.asarray(self.t, dtype=np.float64), np.asarray(self.n_in, dtype=np.int64),
            np.asarray(self.n_out, dtype=np.int64), hashes, offsets,
            np.asarray(self.ttft, dtype=np.float64) if self.with_latency else None,
            np.asarray(self.lat, dtype=np.float64) if self.with_latency else None,
        )
        self._reset()
        return chunk
