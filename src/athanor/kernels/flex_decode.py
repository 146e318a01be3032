"""Decode attention as one fused pass per row: PyTorch's flex attention, compiled by Inductor (the CPU's).

On a CPU decode attention is memory-bound, and the plain path streams the cache slowly: MKL's small
batched matmuls (3 x 64 x L a row for SmolLM2) and SDPA's CPU flash kernel read K and V at about half
the bandwidth a plain sum over the same views reaches. Inductor's flex-attention template reads each key
and value once in a fused loop with an online softmax, faster than the per-row views (`per_seq_attention`).

It attends over the same batched views of the paged pool as `decode_attention_per_seq` (nothing
gathered), with the rows' lengths as a score mask, and falls back to its row-at-a-time path where
those views do not apply (pages not consecutive, a head-major pool). Compiled once per process with
dynamic shapes (batch size 1 is specialised: a second compile); not graph-safe (the views are
chosen on the host, from the block table).

Heads narrower than `MIN_HEAD_DIM` take the fallback too: with torch 2.13 (CPU), the compiled flex
attention of 16-wide heads returns wrong rows whenever the keys number 8 modulo 16 (8, 24, 40, ...);
heads of 32, 64 and 128 match the per-row path at every length tested.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch
from torch import Tensor

from athanor.kernels.per_seq_attention import attend_rows, batch_views, row_runs

MIN_HEAD_DIM = 32


def _attend(q: Tensor, keys: Tensor, values: Tensor, kv_lens: Tensor) -> Tensor:
    """q [B, Hq, 1, D] over keys/values [B, Hkv, L, D]; row b attends to its first kv_lens[b] keys."""
    from torch.nn.attention.flex_attention import flex_attention

    def live(score: Tensor, b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        return torch.where(kv_idx < kv_lens[b], score, -float("inf"))

    return flex_attention(q, keys, values, score_mod=live, enable_gqa=True)


@functools.cache
def _compiled() -> Callable[[Tensor, Tensor, Tensor, Tensor], Tensor]:
    return torch.compile(_attend, dynamic=True)  # flex attention runs fused only when compiled


def decode_attention_flex(q: Tensor, k_cache: Tensor, v_cache: Tensor, slots: Tensor, block_table: Tensor,
                          kv_lens: Tensor) -> Tensor:
    """Grouped-query decode attention, as `decode_attention_per_seq` (same arguments). Returns [B, Hq, D]."""
    rows, lens = slots.tolist(), kv_lens.tolist()
    firsts = row_runs(k_cache, v_cache, block_table, rows, lens)
    views = batch_views(k_cache, v_cache, firsts, lens) if q.shape[-1] >= MIN_HEAD_DIM else None
    if views is None:
        return attend_rows(q, k_cache, v_cache, block_table, rows, lens, firsts)
    keys, values = views
    return _compiled()(q[:, :, None], keys, values, kv_lens)[:, :, 0]
