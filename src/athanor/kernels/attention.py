"""Decode attention: one new query per sequence against its slot's cached keys and values.

The KV cache is paged (`kernels.paging`): k_cache, v_cache [num_pages + 1, Hkv, page_size, D] per layer, and token p
of slot s is row p % page_size of page block_table[s, p // page_size]. The first `kv_lens[b]` tokens of slot
`slots[b]` are attended (positions + 1 once the new token is written). The Triton path (split-KV flash-decoding,
`jit/attention.py`) reads the keys through the block table in place, with a static grid and no host syncs, so it can
be captured in a CUDA graph at any context length.
"""

from __future__ import annotations

import functools

import torch
from torch import Tensor

from athanor.kernels.dispatch import WARPS, Impl, cdiv, check_choice, next_pow2, pdl, tickets, use_triton
from athanor.kernels.paging import gather_kv
from athanor.kernels.rope import KVWrite, rope_into

BLOCK_N = 64
"""Keys per tile of the Triton kernel (see `default_kv_block`)."""
KV_BLOCKS = (16, 32, 64, 128)
"""The keys per tile `decode_attention(kv_block=)` may set."""
MAX_SPLITS = 64


@functools.lru_cache(maxsize=8)
def _num_sms(device: torch.device) -> int:
    if device.type == "cuda":
        return int(torch.cuda.get_device_properties(device).multi_processor_count)
    return 8


def default_kv_block(batch: int, num_kv_heads: int, max_seq_len: int, device: torch.device) -> int:
    """Keys per tile of the split kernel, and so the fewest keys a split holds: `BLOCK_N`, or half of it where
    `BLOCK_N` keys a split would leave SMs without a split program (a short context over few KV heads: qwen3-30b-a3b's
    4 at 1k keys, 68 programs on an H200's 132). Smaller tiles give such a context more splits, each with less to do
    after its wait, and the merge more to combine; with enough programs the larger tiles are faster."""
    few = batch * num_kv_heads * cdiv(max_seq_len, BLOCK_N) < _num_sms(device)
    return BLOCK_N // 2 if few else BLOCK_N


def num_kv_splits(batch: int, num_kv_heads: int, max_seq_len: int, device: torch.device,
                  kv_block: int | None = None) -> int:
    """Splits of each sequence's keys so that about four programs per SM have work, at least `kv_block` keys each
    (None: `default_kv_block`).

    Static in (batch, heads, max_seq_len), so a captured graph keeps its grid; the slice each
    split covers adapts to the real length inside the kernel.
    """
    block = _kv_block(kv_block, batch, num_kv_heads, max_seq_len, device)
    target = 4 * _num_sms(device)
    splits = cdiv(target, max(1, batch * num_kv_heads))
    return max(1, min(splits, MAX_SPLITS, cdiv(max_seq_len, block)))


def _kv_block(kv_block: int | None, batch: int, num_kv_heads: int, max_seq_len: int, device: torch.device) -> int:
    if kv_block is None:
        return default_kv_block(batch, num_kv_heads, max_seq_len, device)
    return check_choice("kv_block", kv_block, KV_BLOCKS, "keys a tile")


def decode_attention_torch(q: Tensor, k_cache: Tensor, v_cache: Tensor, slots: Tensor, block_table: Tensor,
                           kv_lens: Tensor, static: bool = False) -> Tensor:
    """The reference's grouped-query decode attention over the cache. Returns [B, Hq, D].

    Each row's keys are gathered through the block table (`paging.gather_kv`): eagerly up to the longest live context
    (a host sync); with `static` (or under CUDA-graph capture) over all of a row's pages_per_seq pages with a mask,
    which torch.compile and graphs need.
    """
    b, hq, d = q.shape
    hkv = k_cache.shape[1]
    static = static or (q.is_cuda and torch.cuda.is_current_stream_capturing())
    kv_len = block_table.shape[1] * k_cache.shape[2] if static else int(kv_lens.max())
    keys = gather_kv(k_cache, block_table, slots, kv_len)  # [B, Hkv, L, D]
    values = gather_kv(v_cache, block_table, slots, kv_len)
    mask = torch.arange(kv_len, device=q.device)[None, :] < kv_lens[:, None]  # [B, L]
    qg = q.view(b, hkv, hq // hkv, d)
    scores = (qg @ keys.transpose(-1, -2)).float() * d**-0.5  # [B, Hkv, G, L]
    scores = scores.masked_fill(~mask[:, None, None, :], float("-inf"))
    probs = torch.softmax(scores, dim=-1).to(values.dtype)
    return (probs @ values).reshape(b, hq, d)


def decode_attention(q: Tensor, k_cache: Tensor, v_cache: Tensor, slots: Tensor, block_table: Tensor,
                     kv_lens: Tensor, num_splits: int | None = None, static: bool = False, impl: Impl = None,
                     merge_early: bool = False, lens_offset: int = 0, early_keys: bool = False,
                     split_early: bool = False, *, kv_block: int | None = None, split_warps: int = 4,
                     merge_warps: int = 1) -> Tensor:
    """Attention of one query per sequence over its cached keys. Returns [B, Hq, D] in q's dtype.

    q: [B, Hq, D]; k_cache, v_cache: pools [num_pages + 1, Hkv, page_size, D] (any strides with a contiguous
    head_dim: token-major storage [num_pages + 1, page_size, Hkv, D] passed as `.transpose(1, 2)`); slots, kv_lens:
    [B] int64 (every kv_lens[b] >= 1); block_table: [num_slots, pages_per_seq] int32, token p of slot s in page
    block_table[s, p // page_size], row p % page_size (entries past a row's kv_lens are never read). `num_splits`
    defaults to `num_kv_splits(...)` over pages_per_seq * page_size keys; `static` makes the PyTorch path sync-free
    (the Triton path always is).

    `merge_early` (Triton, under PDL): the merge kernel lets the next kernel launch right after its wait instead
    of as it exits, so the O projection's programs load their first weight tiles while the merge runs: a choice per
    model, since a large O projection's early loads slow the merge more than they save.

    `lens_offset`: each row attends kv_lens[b] + lens_offset keys, so a decode step can pass its positions with
    offset 1 and spare the launch that would add the 1 (a microsecond of a batch-1 step).

    `early_keys` (Triton, under PDL): each split program loads its first tile of keys and values before waiting for
    the kernel before it, and reads only each row's newest key again after the wait. The caller promises what a
    decode step's layer holds to: of the keys attended, only each row's newest was written by that kernel, and it
    lets this one launch only after its own wait (so every earlier kernel, and the inputs slots, block_table and
    kv_lens, are done); the other keys were written by earlier steps.

    `split_early` (Triton, under PDL): the split kernel lets the merge kernel launch as it starts, so the merge's
    programs wait resident instead of launching once the last split program exits (a choice per model too).

    How the Triton kernels run (no value changes beyond the merge's rounding; each default is the fastest decode step,
    as `athanor bench decode` measures it): `kv_block` keys a tile (one of `KV_BLOCKS`; None: `default_kv_block`),
    `split_warps` and `merge_warps` the split and merge kernels' warps (each one of `dispatch.WARPS`).
    """
    if not use_triton(q, impl):
        return decode_attention_torch(q, k_cache, v_cache, slots, block_table,
                                      kv_lens + lens_offset if lens_offset else kv_lens, static)
    return _launch(q, k_cache, v_cache, slots, block_table, kv_lens, num_splits, None, merge_early, lens_offset,
                   early_keys, split_early, kv_block, split_warps, merge_warps)


def rope_cache_attention(q: Tensor, k: Tensor, v: Tensor, kv: KVWrite, kv_lens: Tensor, eps: float = 0.0,
                         num_splits: int | None = None, static: bool = False, impl: Impl = None, *,
                         kv_block: int | None = None, split_warps: int = 4) -> Tensor:
    """`rope_and_cache` then `decode_attention`, in one Triton kernel: q and the new k are q/k-normed (with
    `eps`) and rotated in registers, the program whose key slice holds the new position writes k and v into
    `kv`'s caches (at the position's page and row) before reading them, and the last split of each KV head to
    finish merges the splits. Returns [B, Hq, D].

    q: [B, Hq, D], k, v: [B, Hkv, D], not rotated (strided views of a fused QKV output are fine); kv_lens:
    positions + 1. `kv_block`, `split_warps`: as `decode_attention`'s.
    """
    if not use_triton(q, impl):
        q = rope_into(q, k, v, kv, eps, impl="torch")
        return decode_attention_torch(q, kv.k_cache, kv.v_cache, kv.slots, kv.block_table, kv_lens, static)
    return _launch(q, kv.k_cache, kv.v_cache, kv.slots, kv.block_table, kv_lens, num_splits, (k, v, kv, eps),
                   kv_block=kv_block, split_warps=split_warps)


def _launch(q: Tensor, k_cache: Tensor, v_cache: Tensor, slots: Tensor, block_table: Tensor, kv_lens: Tensor,
            num_splits: int | None, new: tuple[Tensor, Tensor, KVWrite, float] | None, merge_early: bool = False,
            lens_offset: int = 0, early_keys: bool = False, split_early: bool = False, kv_block: int | None = None,
            split_warps: int = 4, merge_warps: int = 1) -> Tensor:
    """The Triton path: split kernel + merge kernel, or (`new`: the new token's k, v, where they go, the q/k norms'
    eps) the fused kernel with its ticket merge."""
    from athanor.kernels.jit.attention import decode_attention_merge_kernel, decode_attention_split_kernel

    b, hq, d = q.shape
    hkv, page_size = k_cache.shape[1], k_cache.shape[2]
    max_len = block_table.shape[1] * page_size
    assert d == next_pow2(d) and q.stride(2) == 1 and k_cache.stride(3) == 1
    assert k_cache.stride() == v_cache.stride() and v_cache.shape[2] == page_size and block_table.stride(1) == 1
    group = hq // hkv
    # Checked before any launch: a bad value launches nothing.
    block_n = _kv_block(kv_block, b, hkv, max_len, q.device)
    split_warps = check_choice("split_warps", split_warps, WARPS, "warps")
    merge_warps = check_choice("merge_warps", merge_warps, WARPS, "warps")
    splits = num_splits or num_kv_splits(b, hkv, max_len, q.device, block_n)
    o_part = torch.empty((b, hq, splits, d), dtype=torch.float32, device=q.device)
    lse_part = torch.empty((b, hq, splits), dtype=torch.float32, device=q.device)
    out = torch.empty((b, hq, d), dtype=q.dtype, device=q.device)
    if b == 0:
        return out
    norms = False
    if new is not None:
        k, v, kv, eps = new
        assert k.stride(2) == 1 and v.stride(2) == 1 and kv.cos.is_contiguous() and kv.sin.is_contiguous()
        assert b * hkv <= tickets(q.device).numel()
        norms = kv.q_norm is not None and kv.k_norm is not None
        fused = (k, v, kv.cos, kv.sin, kv.positions, kv.q_norm if norms else kv.cos, kv.k_norm if norms else kv.cos,
                 eps)
        new_strides = (k.stride(0), k.stride(1), v.stride(0), v.stride(1))
    else:
        fused = (q, q, q, q, slots, q, q, 0.0)  # stand-ins: unread without ROPE
        new_strides = (0, 0, 0, 0)
    decode_attention_split_kernel[(b, hkv, splits)](
        q, k_cache, v_cache, slots, block_table, kv_lens, o_part, lse_part, out, tickets(q.device), *fused,
        q.stride(0), q.stride(1), *new_strides, k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        block_table.stride(0),
        o_part.stride(0), o_part.stride(1), o_part.stride(2), lse_part.stride(0), lse_part.stride(1),
        out.stride(0), out.stride(1), d**-0.5,
        GROUP=group, NUM_SPLITS=splits, HEAD_DIM=d, BLOCK_G=max(16, next_pow2(group)), BLOCK_N=block_n,
        BLOCK_H=next_pow2(group), BLOCK_S=next_pow2(splits), S_CHUNK=_merge_chunk(next_pow2(group), splits, d),
        PAGE_SIZE=page_size, ROPE=new is not None, QK_NORM=norms, MERGE=new is not None, LENS_OFFSET=lens_offset,
        EARLY_KEYS=early_keys and new is None, TRIGGER=split_early and new is None, num_warps=split_warps, **pdl(q),
    )
    if new is None:
        decode_attention_merge_kernel[(b, hq)](
            o_part, lse_part, out,
            o_part.stride(0), o_part.stride(1), o_part.stride(2), lse_part.stride(0), lse_part.stride(1),
            out.stride(0), out.stride(1),
            NUM_SPLITS=splits, BLOCK_S=next_pow2(splits), S_CHUNK=_merge_chunk(1, splits, d), HEAD_DIM=d,
            EARLY=merge_early, num_warps=merge_warps, **pdl(q),
        )
    return out


def _merge_chunk(heads: int, splits: int, head_dim: int) -> int:
    """Splits merged per step: a [heads, chunk, head_dim] fp32 tile of at most 4096 values (32 registers a
    thread at 4 warps), so long contexts' 64 splits do not spill."""
    return max(1, min(next_pow2(splits), 4096 // (heads * head_dim)))
