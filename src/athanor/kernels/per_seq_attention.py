"""Decode attention one sequence at a time over views of its own cached keys and values (PyTorch).

The batched fallback (`attention.decode_attention_torch`) gathers every row's cache up to the
longest context with `index_select`: a copy of B x L x heads x D per layer, read twice more by
the two matmuls. Slicing `k_cache[slot, :, :len]` is a view, so this reads each sequence's keys
once and only up to its own length. It loops over the batch on the host (`.tolist()`), so it is
not CUDA-graph safe: it is the CPU's answer, where there are no graphs and memory traffic is
everything (several times faster per layer than the gather at batch 8-32 and contexts of thousands).

When the rows' slots are consecutive (an engine hands slots out in order) the cache rows
`k_cache[s0:s0 + B, :, :L]` are themselves a view, so the whole batch attends in three batched
ops instead of a Python loop of five per row — provided the longest context L wastes little on
the shorter ones (at most `MAX_PADDING` of the keys read are masked out).
"""

from __future__ import annotations

import torch
from torch import Tensor

from athanor.model.reference import decode_attention

MAX_PADDING = 0.25
"""Largest share of masked-out keys the batched view path may read (else: one row at a time)."""


def decode_attention_per_seq(q: Tensor, k_cache: Tensor, v_cache: Tensor, slots: Tensor, kv_lens: Tensor) -> Tensor:
    """Grouped-query decode attention. Returns [B, Hq, D].

    q: [B, Hq, D]; k_cache, v_cache: [slots, Hkv, max_seq_len, D] (any strides); slots, kv_lens: [B] int64.
    """
    b, hq, d = q.shape
    rows, lens = slots.tolist(), kv_lens.tolist()
    views = batch_views(k_cache, v_cache, rows, lens) if b > 1 else None
    if views is not None:
        keys, values = views
        mask = torch.arange(keys.shape[2], device=q.device)[None, :] < kv_lens[:, None]
        return decode_attention(q, keys, values, mask).view(b, hq, d)
    return attend_rows(q, k_cache, v_cache, rows, lens)


def batch_views(k_cache: Tensor, v_cache: Tensor, rows: list[int], lens: list[int]) -> tuple[Tensor, Tensor] | None:
    """The batch's keys and values [B, Hkv, L, D] as views of the caches (rows: the slots, lens: their
    contexts, both read to the host once by the caller; L: the longest context), or None where that would not
    pay: slots not consecutive, or more than `MAX_PADDING` of the keys masked out."""
    b, longest = len(rows), max(lens, default=0)
    if b and rows == list(range(rows[0], rows[0] + b)) and b * longest * (1 - MAX_PADDING) <= sum(lens):
        return k_cache[rows[0]:rows[0] + b, :, :longest], v_cache[rows[0]:rows[0] + b, :, :longest]
    return None


def attend_rows(q: Tensor, k_cache: Tensor, v_cache: Tensor, rows: list[int], lens: list[int]) -> Tensor:
    """One row at a time over its own cache views (five small ops a row)."""
    _, hq, d = q.shape
    hkv = k_cache.shape[1]
    out = torch.empty_like(q)
    for row, (slot, n) in enumerate(zip(rows, lens)):
        keys, values = k_cache[slot, :, :n], v_cache[slot, :, :n]  # [Hkv, n, D] views
        qg = q[row].view(hkv, hq // hkv, d)  # query heads sharing one KV head are adjacent
        scores = (qg @ keys.transpose(-1, -2)).float() * d**-0.5  # [Hkv, G, n]
        probs = torch.softmax(scores, dim=-1).to(values.dtype)
        out[row] = (probs @ values).reshape(hq, d)
    return out
