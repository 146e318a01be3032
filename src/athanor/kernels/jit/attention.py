"""Split-KV flash-decoding with GQA over the reference's per-slot KV layout.

Stage 1: grid (batch, kv heads, splits). Each program takes the query heads that share one KV
head (a [G, D] tile, padded to 16 rows for tl.dot) and one slice of its sequence's keys, and
writes a partial output and log-sum-exp. The slice length is derived *inside* the kernel from the
sequence's own length (cdiv(kv_len, splits)), so the grid is static (CUDA-graph safe) while every
split has work whether the context is 100 or 100k tokens.
Stage 2: grid (batch, q heads) merges the splits by their log-sum-exp.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def decode_attention_split_kernel(
    Q, K_CACHE, V_CACHE, SLOTS, KV_LENS, O_PART, LSE_PART,
    q_s0, q_s1, c_s0, c_s1, c_s2, o_s0, o_s1, o_s2, l_s0, l_s1,
    scale,
    GROUP: tl.constexpr, NUM_SPLITS: tl.constexpr, HEAD_DIM: tl.constexpr,
    BLOCK_G: tl.constexpr, BLOCK_N: tl.constexpr, PDL: tl.constexpr,
):
    if PDL:  # programmatic dependent launch: wait for the kernel that wrote q and the cache
        tl.extra.cuda.gdc_wait()
    b = tl.program_id(0)
    hk = tl.program_id(1)
    split = tl.program_id(2)
    slot = tl.load(SLOTS + b)
    kv_len = tl.load(KV_LENS + b).to(tl.int32)
    chunk = tl.cdiv(tl.cdiv(kv_len, NUM_SPLITS), BLOCK_N) * BLOCK_N
    start = split * chunk
    end = tl.minimum(start + chunk, kv_len)

    g = tl.arange(0, BLOCK_G)
    d = tl.arange(0, HEAD_DIM)
    heads = hk * GROUP + g
    g_mask = g < GROUP
    q = tl.load(Q + b * q_s0 + heads[:, None] * q_s1 + d[None, :], mask=g_mask[:, None], other=0.0)  # [G, D]
    kv_base = slot.to(tl.int64) * c_s0 + hk * c_s1

    m_i = tl.full([BLOCK_G], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_G], tl.float32)
    acc = tl.zeros([BLOCK_G, HEAD_DIM], tl.float32)
    for n0 in range(start, end, BLOCK_N):
        offs = n0 + tl.arange(0, BLOCK_N)
        n_mask = offs < end
        kv_offs = kv_base + offs[:, None].to(tl.int64) * c_s2 + d[None, :]
        k = tl.load(K_CACHE + kv_offs, mask=n_mask[:, None], other=0.0)  # [N, D]
        v = tl.load(V_CACHE + kv_offs, mask=n_mask[:, None], other=0.0)
        scores = tl.dot(q, tl.trans(k)) * scale  # [G, N] fp32
        scores = tl.where(n_mask[None, :], scores, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(scores, axis=1))
        alpha = tl.exp(m_i - m_new)
        p = tl.exp(scores - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m_i = m_new

    has_keys = l_i > 0
    out = acc / tl.where(has_keys, l_i, 1.0)[:, None]
    lse = tl.where(has_keys, m_i + tl.log(tl.where(has_keys, l_i, 1.0)), float("-inf"))
    o_ptrs = O_PART + b * o_s0 + heads[:, None] * o_s1 + split * o_s2 + d[None, :]
    tl.store(o_ptrs, out, mask=g_mask[:, None])
    tl.store(LSE_PART + b * l_s0 + heads * l_s1 + split, lse, mask=g_mask)


@triton.jit
def decode_attention_merge_kernel(
    O_PART, LSE_PART, OUT,
    o_s0, o_s1, o_s2, l_s0, l_s1, out_s0, out_s1,
    NUM_SPLITS: tl.constexpr, BLOCK_S: tl.constexpr, HEAD_DIM: tl.constexpr, PDL: tl.constexpr,
):
    if PDL:
        tl.extra.cuda.gdc_wait()
    b = tl.program_id(0)
    h = tl.program_id(1)
    s = tl.arange(0, BLOCK_S)
    d = tl.arange(0, HEAD_DIM)
    s_mask = s < NUM_SPLITS
    lse = tl.load(LSE_PART + b * l_s0 + h * l_s1 + s, mask=s_mask, other=float("-inf"))
    m = tl.max(lse, axis=0)  # finite: split 0 always holds the sequence's first key
    w = tl.exp(lse - m)
    w = w / tl.sum(w, axis=0)
    parts = tl.load(O_PART + b * o_s0 + h * o_s1 + s[:, None] * o_s2 + d[None, :], mask=s_mask[:, None], other=0.0)
    out = tl.sum(parts * w[:, None], axis=0)
    tl.store(OUT + b * out_s0 + h * out_s1 + d, out.to(OUT.dtype.element_ty))
