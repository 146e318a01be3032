"""Rotary embedding in HF's rotate-half layout, optionally writing k and v into the KV cache."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def rope_kernel(
    Q, K, V, COS, SIN, POS, SLOTS, Q_OUT, K_OUT, K_CACHE, V_CACHE, QN, KN, eps,
    q_s0, q_s1, k_s0, k_s1, v_s0, v_s1, qo_s0, qo_s1, ko_s0, ko_s1,
    c_s0, c_s1, c_s2,
    NUM_Q_HEADS, HALF: tl.constexpr, WRITE_CACHE: tl.constexpr, QK_NORM: tl.constexpr, PDL: tl.constexpr,
):
    # grid: (tokens, q heads + kv heads); one program rotates one head of one token.
    if PDL:  # launched before the projection that makes q, k, v has finished: wait for it
        tl.extra.cuda.gdc_wait()
    n = tl.program_id(0)
    h = tl.program_id(1)
    pos = tl.load(POS + n)
    d = tl.arange(0, HALF)
    cos1 = tl.load(COS + pos * (2 * HALF) + d).to(tl.float32)
    cos2 = tl.load(COS + pos * (2 * HALF) + HALF + d).to(tl.float32)
    sin1 = tl.load(SIN + pos * (2 * HALF) + d).to(tl.float32)
    sin2 = tl.load(SIN + pos * (2 * HALF) + HALF + d).to(tl.float32)
    if h < NUM_Q_HEADS:
        src = Q + n * q_s0 + h * q_s1
        dst = Q_OUT + n * qo_s0 + h * qo_s1
        norm_w = QN
    else:
        norm_w = KN
        hk = h - NUM_Q_HEADS
        src = K + n * k_s0 + hk * k_s1
        if WRITE_CACHE:
            slot = tl.load(SLOTS + n)
            dst = K_CACHE + slot * c_s0 + hk * c_s1 + pos * c_s2
            v = tl.load(V + n * v_s0 + hk * v_s1 + tl.arange(0, 2 * HALF))
            tl.store(V_CACHE + slot * c_s0 + hk * c_s1 + pos * c_s2 + tl.arange(0, 2 * HALF), v)
        else:
            dst = K_OUT + n * ko_s0 + hk * ko_s1
    x1 = tl.load(src + d)
    x2 = tl.load(src + HALF + d)
    if QK_NORM:  # the per-head RMSNorm before rotating, rounded as rms_norm: (x * rstd) to dtype, times w
        a = x1.to(tl.float32)
        b = x2.to(tl.float32)
        rstd = 1.0 / tl.sqrt((tl.sum(a * a, axis=0) + tl.sum(b * b, axis=0)) / (2 * HALF) + eps)
        w1 = tl.load(norm_w + d).to(tl.float32)
        w2 = tl.load(norm_w + HALF + d).to(tl.float32)
        x1 = (w1 * (a * rstd).to(x1.dtype).to(tl.float32)).to(x1.dtype)
        x2 = (w2 * (b * rstd).to(x2.dtype).to(tl.float32)).to(x2.dtype)
    x1f = x1.to(tl.float32)
    x2f = x2.to(tl.float32)
    tl.store(dst + d, (x1f * cos1 - x2f * sin1).to(x1.dtype))
    tl.store(dst + HALF + d, (x2f * cos2 + x1f * sin2).to(x1.dtype))
