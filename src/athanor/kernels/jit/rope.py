"""Rotary embedding in HF's rotate-half layout, optionally writing k and v into the paged KV cache (position p of
slot s: row p % PAGE_SIZE of page BT[s, p // PAGE_SIZE])."""

from __future__ import annotations

import triton
import triton.language as tl

from athanor.kernels.jit.attention import rope_rows, token_offset


@triton.jit
def rope_kernel(
    Q, K, V, COS, SIN, POS, SLOTS, BT, Q_OUT, K_OUT, K_CACHE, V_CACHE, QN, KN, eps,
    q_s0, q_s1, k_s0, k_s1, v_s0, v_s1, qo_s0, qo_s1, ko_s0, ko_s1,
    c_s0, c_s1, c_s2, bt_s0,
    NUM_Q_HEADS, HEAD_DIM: tl.constexpr, PAGE_SIZE: tl.constexpr, WRITE_CACHE: tl.constexpr, QK_NORM: tl.constexpr,
    PDL: tl.constexpr,
):
    # grid: (tokens, q heads + kv heads); one program rotates one head of one token (q/k-normed first
    # under QK_NORM: `rope_rows`).
    if PDL:  # launched before the projection that makes q, k, v has finished: wait for it
        tl.extra.cuda.gdc_wait()
    n = tl.program_id(0).to(tl.int64)  # tokens x stride may pass 2^31
    h = tl.program_id(1)
    pos = tl.load(POS + n)
    d = tl.arange(0, HEAD_DIM)
    cos = tl.load(COS + pos * HEAD_DIM + d).to(tl.float32)
    sin = tl.load(SIN + pos * HEAD_DIM + d).to(tl.float32)
    if h < NUM_Q_HEADS:
        src = Q + n * q_s0 + h * q_s1
        dst = Q_OUT + n * qo_s0 + h * qo_s1
        norm_w = QN
    else:
        norm_w = KN
        hk = h - NUM_Q_HEADS
        src = K + n * k_s0 + hk * k_s1
        if WRITE_CACHE:
            at = token_offset(BT, bt_s0, tl.load(SLOTS + n), pos, c_s0, c_s2, PAGE_SIZE) + hk * c_s1
            dst = K_CACHE + at
            v = tl.load(V + n * v_s0 + hk * v_s1 + d)
            tl.store(V_CACHE + at + d, v)
        else:
            dst = K_OUT + n * ko_s0 + hk * ko_s1
    one = tl.zeros([1], tl.int32)
    out = rope_rows(src, one, one[:, None] == 0, d, cos, sin, norm_w, eps, QK_NORM, HEAD_DIM)
    tl.store(dst + one[:, None] + d[None, :], out)


@triton.jit
def rope_head(ROW, head, pos, at, COS, SIN, K_CACHE, V_CACHE, QN, KN, eps, c_s1,
              NUM_Q_HEADS, NUM_KV_HEADS, HEAD_DIM: tl.constexpr, QK_NORM: tl.constexpr):
    """`rope_kernel`'s work for one head of a token's fused QKV row ROW ([(Hq + 2 Hkv) * HEAD_DIM], heads in
    that order, written by other programs of the launch), the token at position `pos` and at offset `at` of the
    pools (`token_offset`: its page and row): a q head rotated in place, a k head rotated into K_CACHE at
    [page, head, row], a v head copied into V_CACHE there."""
    d = tl.arange(0, HEAD_DIM)
    one = tl.zeros([1], tl.int32)
    src = ROW + head * HEAD_DIM
    if head < NUM_Q_HEADS + NUM_KV_HEADS:
        cos = tl.load(COS + pos * HEAD_DIM + d).to(tl.float32)
        sin = tl.load(SIN + pos * HEAD_DIM + d).to(tl.float32)
        is_q = head < NUM_Q_HEADS
        out = rope_rows(src, one, one[:, None] == 0, d, cos, sin, tl.where(is_q, QN, KN), eps, QK_NORM, HEAD_DIM)
        dst = tl.where(is_q, src, K_CACHE + at + (head - NUM_Q_HEADS) * c_s1)
        tl.store(dst + one[:, None] + d[None, :], out)
    else:
        v = tl.load(src + d, cache_modifier=".cg")
        tl.store(V_CACHE + at + (head - NUM_Q_HEADS - NUM_KV_HEADS) * c_s1 + d, v)
