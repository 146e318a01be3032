"""Rotary position embedding (HF rotate-half layout, as `athanor.model.rope.apply_rope`), and its fusion
with the decode step's KV-cache write (one kernel instead of rope + two scatter copies).

The cache is paged (`kernels.paging`): the key of position p of slot s goes to row p % page_size of page
block_table[s, p // page_size] of the pool [num_pages + 1, Hkv, page_size, D]."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from athanor.kernels.dispatch import Impl, pdl, use_triton
from athanor.kernels.norm import rms_norm_torch
from athanor.model.attention import token_pages


@dataclass(frozen=True)
class KVWrite:
    """Where a decode step's new keys and values go, and how q and k are rotated on the way: cos, sin
    [max_seq_len, D] tables; positions, slots [N] int64; block_table [num_slots, pages_per_seq] int32 (position p of
    slot s: page block_table[s, p // page_size], row p % page_size); k_cache, v_cache pools
    [num_pages + 1, Hkv, page_size, D] (any strides with a contiguous D); q_norm, k_norm: Qwen3's per-head RMSNorm
    weights [D], or None."""

    cos: Tensor
    sin: Tensor
    positions: Tensor
    slots: Tensor
    block_table: Tensor
    k_cache: Tensor
    v_cache: Tensor
    q_norm: Tensor | None = None
    k_norm: Tensor | None = None


def _rotate_half(x: Tensor) -> Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def _apply(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    # x: [N, heads, D]; cos, sin: [N, D]
    return x * cos[:, None, :] + _rotate_half(x) * sin[:, None, :]


def rope(q: Tensor, k: Tensor, cos: Tensor, sin: Tensor, positions: Tensor, impl: Impl = None
         ) -> tuple[Tensor, Tensor]:
    """(q, k) rotated by their positions.

    q: [N, Hq, D]; k: [N, Hkv, D] (strided views of a fused QKV output are fine);
    cos, sin: [max_seq_len, D] tables; positions: [N] int64.
    """
    if not use_triton(q, impl):
        c, s = cos.index_select(0, positions), sin.index_select(0, positions)
        return _apply(q, c, s), _apply(k, c, s)
    q_out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    k_out = torch.empty(k.shape, dtype=k.dtype, device=k.device)
    _launch(q, k, k, cos, sin, positions, positions, positions, q_out, k_out, None, None)
    return q_out, k_out


def rope_and_cache(q: Tensor, k: Tensor, v: Tensor, cos: Tensor, sin: Tensor, positions: Tensor, slots: Tensor,
                   block_table: Tensor, k_cache: Tensor, v_cache: Tensor, impl: Impl = None,
                   q_norm: Tensor | None = None, k_norm: Tensor | None = None, eps: float = 0.0) -> Tensor:
    """Rotated q; writes rotated k and v into the caches at [page, :, row], the position's page
    block_table[slot, position // page_size] and row position % page_size.

    q: [N, Hq, D]; k, v: [N, Hkv, D]; k_cache, v_cache: pools [num_pages + 1, Hkv, page_size, D] (any strides with
    a contiguous D); block_table: [num_slots, pages_per_seq] int32; positions, slots: [N] int64. With q_norm and
    k_norm ([D], Qwen3's per-head RMSNorm), q and k are normed first, in the same kernel, rounded as `rms_norm`
    rounds.
    """
    if not use_triton(q, impl):
        if q_norm is not None and k_norm is not None:
            q, k = rms_norm_torch(q, q_norm, eps), rms_norm_torch(k, k_norm, eps)
        q, k = rope(q, k, cos, sin, positions, impl="torch")
        pages, rows = token_pages(block_table, slots, positions, k_cache.shape[2])
        k_cache[pages, :, rows] = k
        v_cache[pages, :, rows] = v
        return q
    q_out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    _launch(q, k, v, cos, sin, positions, slots, block_table, q_out, q_out, k_cache, v_cache, q_norm, k_norm, eps)
    return q_out


def rope_into(q: Tensor, k: Tensor, v: Tensor, kv: KVWrite, eps: float = 0.0, impl: Impl = None) -> Tensor:
    """`rope_and_cache` with the destination, tables and norms of one `KVWrite`: rotated q."""
    return rope_and_cache(q, k, v, kv.cos, kv.sin, kv.positions, kv.slots, kv.block_table, kv.k_cache, kv.v_cache,
                          impl=impl, q_norm=kv.q_norm, k_norm=kv.k_norm, eps=eps)


def _launch(q: Tensor, k: Tensor, v: Tensor, cos: Tensor, sin: Tensor, positions: Tensor, slots: Tensor,
            block_table: Tensor, q_out: Tensor, k_out: Tensor, k_cache: Tensor | None, v_cache: Tensor | None,
            q_norm: Tensor | None = None, k_norm: Tensor | None = None, eps: float = 0.0) -> None:
    from athanor.kernels.jit.rope import rope_kernel

    n, hq, d = q.shape
    hkv = k.shape[1]
    assert q.stride(2) == 1 and k.stride(2) == 1 and v.stride(2) == 1, "head_dim must be contiguous"
    assert cos.is_contiguous() and sin.is_contiguous()
    write = k_cache is not None
    kc = k_cache if k_cache is not None else q_out
    vc = v_cache if v_cache is not None else q_out
    c_strides = (kc.stride(0), kc.stride(1), kc.stride(2), block_table.stride(0)) if write else (0, 0, 0, 0)
    if write:
        assert v_cache is not None and v_cache.stride()[:3] == kc.stride()[:3] and v_cache.shape[2] == kc.shape[2]
    if n:
        norms = q_norm is not None and k_norm is not None
        rope_kernel[(n, hq + hkv)](
            q, k, v, cos, sin, positions, slots, block_table, q_out, k_out, kc, vc,
            q_norm if q_norm is not None else cos, k_norm if k_norm is not None else cos, eps,
            q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
            q_out.stride(0), q_out.stride(1), k_out.stride(0), k_out.stride(1), *c_strides,
            hq, HEAD_DIM=d, PAGE_SIZE=kc.shape[2] if write else 1, WRITE_CACHE=write, QK_NORM=norms, **pdl(q),
        )
