"""Prefill attention: a packed batch of chunks, each attending causally over its slot's cached keys.

The KV cache is a pool of pages: key p of slot s sits in page block_table[s, p // page_size], row p % page_size.
The caller writes the chunks' keys and values into their pages first; query j of sequence b sits at position
starts[b] + j and sees keys 0..starts[b] + j of slot slots[b]. One call serves fresh prompts and later chunks of
long ones alike, all sequences at once. The Triton path (`jit/prefill_attention.py`) is a flash-attention kernel
reading the pool in place through the block table; the fallback is the reference's
(`athanor.model.attention.prefill_attention`).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from athanor.kernels.dispatch import Impl, cdiv, check_choice, next_pow2, use_triton
from athanor.model.attention import PrefillExtent
from athanor.model.attention import prefill_attention as prefill_attention_torch

BLOCKS = (16, 32, 64, 128)
"""The query and key tile sizes `prefill_attention(block_m=, block_n=)` may set."""
WARPS = (4, 8)
"""The warps it may launch with: a [128, 128] tile's two dots want 8 on Hopper, smaller tiles 4."""


def prefill_attention(q: Tensor, k_cache: Tensor, v_cache: Tensor, cu_seqlens: Tensor, slots: Tensor,
                      block_table: Tensor, starts: Tensor, extent: PrefillExtent, impl: Impl = None, *,
                      block_m: int = 128, block_n: int = 128, num_warps: int = 8, num_stages: int = 3) -> Tensor:
    """Attention [T, Hq, D] in q's dtype of a packed prefill's queries over their slots' cached keys.

    q: [T, Hq, D] packed by cu_seqlens [B+1] (int64); k_cache, v_cache: pools [num_pages + 1, Hkv, page_size, D]
    (page_size a power of two; the last page scratch), any strides with a contiguous head_dim (a token-major pool
    as a transposed view); slots, starts: [B] int64; block_table: [num_slots, pages_per_seq] int32, key p of slot s
    in page block_table[s, p // page_size], row p % page_size (entries past a sequence's length are never read);
    extent: `attention.prefill_extent(cu_seqlens, starts)` (its longest sequence sizes the grid). How the Triton
    kernel runs (no value changes beyond the online softmax's rounding): `block_m` queries and `block_n` keys a tile
    (each one of `BLOCKS`, whatever the page size), `num_warps` (one of `WARPS`) and `num_stages` of software
    pipelining. The defaults are the fastest tiles tried for head_dim 128 in 16-bit dtypes on Hopper
    (`athanor bench prefill`); 32-bit inputs take tiles of at most 64 x 64, as the default tiles' pipeline stages
    would not fit in shared memory at twice the bytes."""
    if not use_triton(q, impl):
        return prefill_attention_torch(q, k_cache, v_cache, cu_seqlens, slots, block_table, starts, extent)
    from athanor.kernels.jit.prefill_attention import prefill_attention_kernel

    t, hq, d = q.shape
    hkv, page_size = k_cache.shape[1], k_cache.shape[2]
    assert d == next_pow2(d) and q.stride(2) == 1 and k_cache.stride(3) == 1 and v_cache.stride(3) == 1
    assert page_size == next_pow2(page_size) and v_cache.shape[2] == page_size and block_table.stride(1) == 1
    if q.element_size() > 2:
        block_m, block_n, num_warps = min(block_m, 64), min(block_n, 64), min(num_warps, 4)
    block_m = check_choice("block_m", block_m, BLOCKS, "queries a tile")
    block_n = check_choice("block_n", block_n, BLOCKS, "keys a tile")
    num_warps = check_choice("num_warps", num_warps, WARPS, "warps")
    out = torch.empty_like(q)
    b = slots.shape[0]
    if t == 0 or b == 0:
        return out
    prefill_attention_kernel[(cdiv(extent.max_new, block_m), b, hq)](
        q, k_cache, v_cache, out, cu_seqlens, slots, block_table, starts,
        q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2), out.stride(0), out.stride(1), block_table.stride(0),
        d**-0.5 * math.log2(math.e),
        GROUP=hq // hkv, HEAD_DIM=d, BLOCK_M=block_m, BLOCK_N=block_n, PAGE_SIZE=page_size, num_warps=num_warps,
        num_stages=num_stages,
    )
    return out
