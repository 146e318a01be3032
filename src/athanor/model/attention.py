"""The reference forward's attention over a paged KV pool, and the page arithmetic every forward shares: which
page and row hold a token, a slot's pages gathered as one sequence, a packed prefill's extent and padding, and
attention for a packed prefill (one scaled_dot_product_attention) and for a decode step (three plain ops)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.nn.attention import SDPBackend
from torch.nn.attention.bias import CausalBias, causal_lower_right

from athanor.model.seam import pages_for

PREFILL_SDPA = (SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH)
"""Prefill attention's backends in priority order, without cuDNN's (only CUDA has it). Left to
choose, torch takes cuDNN attention on a Hopper GPU, which builds an execution plan on the host for every
sequence length it has not run yet, at several times the cost of the prefill's kernels. A server sees new
prompt lengths all the time; a baseline that pays a plan per length would flatter every candidate that
avoids it, and its timings would depend on which run saw a length first. Used as
`sdpa_kernel(list(PREFILL_SDPA), set_priority=True)`: a tuple, which a candidate sharing the process cannot edit
in place, and the order set each time, as torch's global priority order is process state a candidate could
change."""


def window_mask(key_pos: Tensor, query_pos: Tensor, window: int) -> Tensor:
    """Which keys each query sees (broadcast over the positions given): the causal ones, and with a `window` (> 0)
    only the last `window` of them, the query's own included."""
    mask = key_pos <= query_pos
    return mask & (key_pos > query_pos - window) if window else mask


def decode_attention(q: Tensor, keys: Tensor, values: Tensor, mask: Tensor, scale: float | None = None) -> Tensor:
    """One query per sequence against its cached keys, GQA by grouping query heads per KV head.

    q: [B, Hq, D]; keys, values: [B, Hkv, L, D] (values' D may differ); mask: [B, L] bool (True = attend); scale: of the logits (None:
    1 / sqrt(D)). Returns [B, Hq * D]. Plain matmuls: for a single query, SDPA's CPU kernels cost several times these
    three ops.
    """
    b, hq, d = q.shape
    hkv = keys.shape[1]
    qg = q.view(b, hkv, hq // hkv, d)  # query heads sharing one KV head are adjacent
    scores = (qg @ keys.transpose(-1, -2)).float() * (scale or d**-0.5)  # [B, Hkv, G, L]
    scores = scores.masked_fill(~mask[:, None, None, :], float("-inf"))
    probs = torch.softmax(scores, dim=-1).to(values.dtype)
    return (probs @ values).reshape(b, -1)


def token_pages(block_table: Tensor, slots: Tensor, positions: Tensor, page_size: int) -> tuple[Tensor, Tensor]:
    """Where token positions[n] of slot slots[n] lives: (its page [N] int64, its row in the page [N])."""
    return block_table[slots, positions // page_size].long(), positions % page_size


def slot_pages(block_table: Tensor, slots: Tensor, num_tokens: int, page_size: int) -> Tensor:
    """The pages [B, ceil(num_tokens / page_size)] int64 holding the first `num_tokens` tokens of each slot."""
    return block_table.index_select(0, slots)[:, :pages_for(num_tokens, page_size)].long()


def merges_pages(pool: Tensor) -> bool:
    """Whether page i + 1 of a pool indexed [pages, Hkv, page_size, D] continues page i's rows (token-major storage:
    stride(0) == page_size * stride(2)), so that consecutive pages are one strided run of tokens."""
    return pool.stride(0) == pool.shape[2] * pool.stride(2)


def gather_pages(pool: Tensor, pages: Tensor) -> Tensor:
    """The keys (or values) of `pages` [B, P] of a pool indexed [pages, Hkv, page_size, D], each row's pages as one
    sequence: [B, Hkv, P * page_size, D], in one copy whichever way the pool is laid out in memory."""
    if merges_pages(pool):
        return pool[pages].transpose(1, 2).flatten(2, 3)
    return pool.transpose(0, 1)[:, pages].transpose(0, 1).flatten(2, 3)


def token_rows(cu_seqlens: Tensor, per_seq: Tensor, num_tokens: int) -> Tensor:
    """Each packed token's entry of `per_seq` [B] (its sequence's slot, say): [T]."""
    return torch.repeat_interleave(per_seq, cu_seqlens[1:] - cu_seqlens[:-1], output_size=num_tokens)


@dataclass(frozen=True)
class PrefillExtent:
    """How far a packed prefill reaches, read once per prefill (one host sync) and used by every layer."""

    max_new: int
    """The longest sequence's new tokens."""
    kv_len: int
    """The most keys a sequence attends over (its cached and new tokens)."""


def prefill_extent(cu_seqlens: Tensor, starts: Tensor) -> PrefillExtent:
    """The extent of a prefill whose sequences are packed by cu_seqlens [B+1] and continue from starts [B]."""
    lens = cu_seqlens[1:] - cu_seqlens[:-1]
    max_new, kv_len = torch.stack([lens.max(), (starts + lens).max()]).tolist()
    return PrefillExtent(int(max_new), int(kv_len))


def prefill_attention(q: Tensor, k_cache: Tensor, v_cache: Tensor, cu_seqlens: Tensor, slots: Tensor,
                      block_table: Tensor, starts: Tensor, extent: PrefillExtent, window: int = 0,
                      scale: float | None = None,
                      expand: Callable[[Tensor, Tensor], tuple[Tensor, Tensor]] | None = None) -> Tensor:
    """Causal attention of a packed prefill's queries over their slots' cached keys, which already hold the new
    ones: query j of sequence b sits at position starts[b] + j and sees keys 0..starts[b] + j (with a `window`, only
    the last `window` of those). Returns [T, Hq, D].

    q: [T, Hq, D] packed by cu_seqlens [B+1]; k_cache, v_cache: pools [pages, Hkv, page_size, D]; slots, starts:
    [B]; block_table: the engine's [slots, pages_per_seq]; extent: `prefill_extent(cu_seqlens, starts)`; scale: of
    the logits (None: 1 / sqrt(D)); expand: what makes keys and values of the gathered cache rows (MLA's). Each
    slot's keys are gathered from its pages, then all sequences go through one scaled_dot_product_attention: a lone
    sequence without a window with lower-right causal alignment (flash attention, nothing materialised), otherwise
    padded to the longest one's queries with a mask of which keys each position sees.
    """
    t = q.shape[0]
    b = slots.shape[0]
    max_new, kv_len = extent.max_new, extent.kv_len
    pages = slot_pages(block_table, slots, kv_len, k_cache.shape[2])
    keys = gather_pages(k_cache, pages)[:, :, :kv_len]  # [B, Hkv, L, D]
    values = gather_pages(v_cache, pages)[:, :, :kv_len]
    if expand is not None:
        keys, values = expand(keys, values)
    if b == 1 and not window:
        mask: Tensor | CausalBias = causal_lower_right(t, kv_len)
        return F.scaled_dot_product_attention(q.transpose(0, 1)[None], keys, values, attn_mask=mask,
                                              enable_gqa=True, scale=scale)[0].transpose(0, 1)
    padded, q_pos, unpad = pad_queries(q, cu_seqlens, starts, max_new)
    mask = window_mask(torch.arange(kv_len, device=q.device)[None, None, :], q_pos[:, :, None], window)  # [B, M, L]
    out = F.scaled_dot_product_attention(padded.transpose(1, 2), keys, values, attn_mask=mask[:, None],
                                         enable_gqa=True, scale=scale)  # [B, Hq, M, D]
    return unpad(out.transpose(1, 2))


def pad_queries(q: Tensor, cu_seqlens: Tensor, starts: Tensor,
                max_new: int) -> tuple[Tensor, Tensor, Callable[[Tensor], Tensor]]:
    """Packed queries q [T, H, D] as one row per sequence, [B, max_new, H, D] (zero past a sequence's end), with
    their positions [B, max_new] and the function that packs a padded result [B, max_new, ...] back to [T, ...]."""
    t, b = q.shape[0], cu_seqlens.shape[0] - 1
    seq = token_rows(cu_seqlens, torch.arange(b, device=q.device), t)  # [T] each token's sequence
    j = torch.arange(t, device=q.device) - cu_seqlens[seq]  # [T] its index in the sequence
    padded = q.new_zeros(b, max_new, *q.shape[1:])
    padded[seq, j] = q
    q_pos = starts[:, None] + torch.arange(max_new, device=q.device)[None, :]
    return padded, q_pos, lambda out: out[seq, j]
