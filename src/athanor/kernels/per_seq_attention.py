"""Decode attention one sequence at a time over views of its own cached keys and values (PyTorch).

The batched fallback (`attention.decode_attention_torch`) gathers every row's pages up to the
longest context: a copy of B x L x heads x D per layer, read twice more by the two matmuls. Where
a sequence's pages are consecutive and the pool is token-major (`athanor.model.attention.merges_pages`), its keys
are a view of the pool, so this reads each sequence's keys once and only up to its own length;
elsewhere it gathers that sequence's own pages (`paging.gather_pages`). It loops over the batch on
the host (`.tolist()`) and reads the block table there, so it is not CUDA-graph safe: it is the
CPU's answer, where there are no graphs and memory traffic is everything (several times faster
per layer than the gather at batch 8-32 and contexts of thousands).

When every row's pages continue the row before's at one fixed distance (an engine that hands out
slots and pages in order: slot s's pages start at p0 + s * pages_per_seq) the rows' keys are
themselves one strided view [B, Hkv, L, D] of the pool, so the whole batch attends in three
batched ops instead of a Python loop of five per row — provided the longest context L wastes
little on the shorter ones (at most `MAX_PADDING` of the keys read are masked out).
"""

from __future__ import annotations

import torch
from torch import Tensor

from athanor.kernels.dispatch import cdiv
from athanor.kernels.paging import page_runs, run_view
from athanor.model.attention import decode_attention, gather_pages, merges_pages

MAX_PADDING = 0.25
"""Largest share of masked-out keys the batched view path may read (else: one row at a time)."""


def decode_attention_per_seq(q: Tensor, k_cache: Tensor, v_cache: Tensor, slots: Tensor, block_table: Tensor,
                             kv_lens: Tensor) -> Tensor:
    """Grouped-query decode attention. Returns [B, Hq, D].

    q: [B, Hq, D]; k_cache, v_cache: pools [num_pages + 1, Hkv, page_size, D] (any strides with a contiguous D);
    block_table: [num_slots, pages_per_seq] int32 (token p of slot s in page block_table[s, p // page_size], row
    p % page_size); slots, kv_lens: [B] int64.
    """
    b, hq, d = q.shape
    rows, lens = slots.tolist(), kv_lens.tolist()
    firsts = row_runs(k_cache, v_cache, block_table, rows, lens)
    views = batch_views(k_cache, v_cache, firsts, lens) if b > 1 else None
    if views is not None:
        keys, values = views
        mask = torch.arange(keys.shape[2], device=q.device)[None, :] < kv_lens[:, None]
        return decode_attention(q, keys, values, mask).view(b, hq, d)
    return attend_rows(q, k_cache, v_cache, block_table, rows, lens, firsts)


def row_runs(k_cache: Tensor, v_cache: Tensor, block_table: Tensor, rows: list[int], lens: list[int]
             ) -> list[int | None]:
    """Per row (rows: the slots, lens: their contexts, on the host), the first page of its keys where they are a
    view of the pools (consecutive pages of pools that merge pages), else None: read once, used by both paths."""
    if not (merges_pages(k_cache) and merges_pages(v_cache)):
        return [None] * len(rows)
    return page_runs(block_table, rows, lens, k_cache.shape[2])


def batch_views(k_cache: Tensor, v_cache: Tensor, firsts: list[int | None], lens: list[int]
                ) -> tuple[Tensor, Tensor] | None:
    """The batch's keys and values [B, Hkv, L, D] as views of the pools (firsts: `row_runs`; lens: the rows'
    contexts; L: the longest), or None where there is no such view or it would not pay: a row without a run of
    pages, rows not each a fixed number of pages past the one before, or more than `MAX_PADDING` of the keys
    masked out."""
    b, longest = len(lens), max(lens, default=0)
    if not b or b * longest * (1 - MAX_PADDING) > sum(lens) or any(f is None for f in firsts):
        return None
    page_size = k_cache.shape[2]
    first, pages = int(firsts[0] or 0), cdiv(longest, page_size)
    step = int(firsts[1] or 0) - first if b > 1 else pages  # pages from one row's start to the next
    if step < 0 or any(f != first + i * step for i, f in enumerate(firsts)):
        return None
    if first + (b - 1) * step + pages > k_cache.shape[0]:  # the longest row's masked keys would run past the pool
        return None
    return _rows_view(k_cache, first, step, b, longest), _rows_view(v_cache, first, step, b, longest)


def _rows_view(cache: Tensor, first: int, step: int, b: int, length: int) -> Tensor:
    """[B, Hkv, length, D]: row i the `length` tokens from page first + i * step of a pool that merges pages."""
    _, hkv, _, d = cache.shape
    strides = (step * cache.stride(0), cache.stride(1), cache.stride(2), cache.stride(3))
    return cache.as_strided((b, hkv, length, d), strides, cache.storage_offset() + first * cache.stride(0))


def attend_rows(q: Tensor, k_cache: Tensor, v_cache: Tensor, block_table: Tensor, rows: list[int], lens: list[int],
                firsts: list[int | None]) -> Tensor:
    """One row at a time (five small ops a row) over views of its keys where it has a run of pages (firsts:
    `row_runs`), else over its own pages gathered."""
    _, hq, d = q.shape
    hkv, page_size = k_cache.shape[1], k_cache.shape[2]
    out = torch.empty_like(q)
    for row, (slot, n, first) in enumerate(zip(rows, lens, firsts, strict=True)):
        if first is not None:
            keys, values = run_view(k_cache, first, n), run_view(v_cache, first, n)  # [Hkv, n, D] views
        else:
            pages = block_table[slot, :cdiv(n, page_size)][None]
            keys, values = gather_pages(k_cache, pages)[0, :, :n], gather_pages(v_cache, pages)[0, :, :n]
        qg = q[row].view(hkv, hq // hkv, d)  # query heads sharing one KV head are adjacent
        scores = (qg @ keys.transpose(-1, -2)).float() * d**-0.5  # [Hkv, G, n]
        probs = torch.softmax(scores, dim=-1).to(values.dtype)
        out[row] = (probs @ values).reshape(hq, d)
    return out
