"""GEMV for a handful of decode rows with the work around a projection folded into it.

One program owns BLOCK_N output columns for every row and streams its [BLOCK_N, K] strip of the
weight once; rows are reduced one at a time from the same registers (tl.dot would pad the rows
to 16 and shuffle the tile into MMA layouts for nothing: the kernel is bound by the weight read).

Folded in, so that each costs no launch and no round trip through memory:
- NORM (prologue): the input is the residual stream h; the program first reads each row whole for
  its RMS (a few KB from L2, repeated per program), then normalises each K-chunk as it goes,
  rounding like `rms_norm`: (h * rstd) to the model dtype, then times the norm weight.
- SILU (prologue): the input is silu(gate) * up from the gate/up projection's output (X = gate,
  X2 = up), rounded like `silu_mul`.
- RESIDUAL (epilogue): the output is R + x @ W.T, with x @ W.T rounded to the model dtype first,
  as the reference's `x = x + linear(...)` does.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def fused_gemv_kernel(
    X, X2, W, B, NW, R, Y,
    M, N, K, eps,
    x_s0, x2_s0, w_s0, r_s0, y_s0,
    NORM: tl.constexpr, SILU: tl.constexpr, BIAS: tl.constexpr, RESIDUAL: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    rn = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = rn < N
    rk = tl.arange(0, BLOCK_K)
    rm = tl.arange(0, BLOCK_M)
    w_rows = W + rn[:, None].to(tl.int64) * w_s0
    dtype = Y.dtype.element_ty

    rstd = tl.zeros([BLOCK_M], tl.float32)
    if NORM:
        for m in tl.static_range(BLOCK_M):
            ss = tl.zeros([BLOCK_K], tl.float32)
            for k0 in range(0, K, BLOCK_K):
                ks = k0 + rk
                h = tl.load(X + m * x_s0 + ks, mask=(ks < K) & (m < M), other=0.0).to(tl.float32)
                ss += h * h
            r = 1.0 / tl.sqrt(tl.sum(ss, axis=0) / K + eps)
            rstd = tl.where(rm == m, r, rstd)

    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for k0 in range(0, K, BLOCK_K):
        ks = k0 + rk
        k_mask = ks < K
        w = tl.load(w_rows + ks[None, :], mask=n_mask[:, None] & k_mask[None, :], other=0.0).to(tl.float32)
        if NORM:
            nw = tl.load(NW + ks, mask=k_mask, other=0.0).to(tl.float32)
        for m in tl.static_range(BLOCK_M):
            row_mask = k_mask & (m < M)
            x = tl.load(X + m * x_s0 + ks, mask=row_mask, other=0.0)
            if SILU:
                up = tl.load(X2 + m * x2_s0 + ks, mask=row_mask, other=0.0).to(tl.float32)
                g = x.to(tl.float32)
                x = ((g / (1.0 + tl.exp(-g))).to(dtype).to(tl.float32) * up).to(dtype)
            if NORM:
                r = tl.sum(tl.where(rm == m, rstd, 0.0), axis=0)
                x = (nw * (x.to(tl.float32) * r).to(dtype).to(tl.float32)).to(dtype)
            part = tl.sum(w * x.to(tl.float32)[None, :], axis=1)  # [BLOCK_N]
            acc += tl.where(rm[:, None] == m, part[None, :], 0.0)

    if BIAS:
        acc += tl.load(B + rn, mask=n_mask, other=0.0).to(tl.float32)[None, :]
    out = acc.to(dtype)
    mask = (rm[:, None] < M) & n_mask[None, :]
    if RESIDUAL:
        res = tl.load(R + rm[:, None] * r_s0 + rn[None, :], mask=mask, other=0.0)
        out = (out.to(tl.float32) + res.to(tl.float32)).to(dtype)
    tl.store(Y + rm[:, None] * y_s0 + rn[None, :], out, mask=mask)


def _configs() -> list[triton.Config]:
    """A small sweep (every config is compiled and timed once per shape, before graph capture)."""
    shapes = [(4, 1024, 4, 3), (8, 512, 4, 3), (8, 1024, 4, 2), (16, 256, 4, 4), (16, 512, 4, 3),
              (16, 512, 8, 3), (32, 256, 4, 3), (32, 512, 8, 2)]
    return [triton.Config({"BLOCK_N": n, "BLOCK_K": k}, num_warps=warps, num_stages=stages)
            for n, k, warps, stages in shapes]


fused_gemv_tuned = triton.autotune(configs=_configs(), key=["M", "N", "K", "NORM", "SILU", "RESIDUAL"])(
    fused_gemv_kernel)
"""The kernel with BLOCK_N/BLOCK_K and warps/stages chosen per shape on the GPU (the CPU interpreter
runs `fused_gemv_kernel` with fixed blocks instead: timing configs there measures nothing)."""
