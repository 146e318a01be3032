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

SPLIT_K > 1 (a narrow output with a long K, e.g. the down projection: too few column strips to
keep every SM streaming): SPLIT_K programs share a strip, each reducing one K-range into an fp32
workspace; the last to finish (an atomic ticket per strip, acq_rel) sums the partials and runs the
epilogue, then resets the ticket, so one launch does what split-K + a reduce kernel do.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def fused_gemv_kernel(
    X, X2, W, B, NW, R, Y, WS, TICKETS,
    M, N, K, eps,
    x_s0, x2_s0, w_s0, r_s0, y_s0,
    NORM: tl.constexpr, SILU: tl.constexpr, BIAS: tl.constexpr, RESIDUAL: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr,
):
    pid_n = tl.program_id(0)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
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

    k_per_split = tl.cdiv(tl.cdiv(K, SPLIT_K), BLOCK_K) * BLOCK_K
    k_lo = tl.program_id(1) * k_per_split
    k_hi = tl.minimum(k_lo + k_per_split, K)
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for k0 in range(k_lo, k_hi, BLOCK_K):
        ks = k0 + rk
        k_mask = ks < k_hi
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

    mask = (rm[:, None] < M) & n_mask[None, :]
    if SPLIT_K > 1:
        tile = pid_n * BLOCK_M * BLOCK_N + rm[:, None] * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]
        stride = tl.num_programs(0) * BLOCK_M * BLOCK_N
        tl.store(WS + tl.program_id(1) * stride + tile, acc)
        ticket = tl.atomic_add(TICKETS + pid_n, 1)  # acq_rel: the partials above are visible to the last
        if ticket == SPLIT_K - 1:
            acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
            for s in tl.static_range(SPLIT_K):
                acc += tl.load(WS + s * stride + tile, cache_modifier=".cg")  # from L2, not a stale L1
            tl.atomic_xchg(TICKETS + pid_n, 0)  # ready for the next launch (CUDA-graph replays included)
            _epilogue(acc, B, R, Y, rm, rn, n_mask, mask, r_s0, y_s0, BIAS, RESIDUAL)
    else:
        _epilogue(acc, B, R, Y, rm, rn, n_mask, mask, r_s0, y_s0, BIAS, RESIDUAL)


@triton.jit
def _epilogue(acc, B, R, Y, rm, rn, n_mask, mask, r_s0, y_s0, BIAS: tl.constexpr, RESIDUAL: tl.constexpr):
    """Bias, rounding to the model dtype, residual add, store."""
    dtype = Y.dtype.element_ty
    if BIAS:
        acc += tl.load(B + rn, mask=n_mask, other=0.0).to(tl.float32)[None, :]
    out = acc.to(dtype)
    if RESIDUAL:
        res = tl.load(R + rm[:, None] * r_s0 + rn[None, :], mask=mask, other=0.0)
        out = (out.to(tl.float32) + res.to(tl.float32)).to(dtype)
    tl.store(Y + rm[:, None] * y_s0 + rn[None, :], out, mask=mask)


def _configs() -> list[triton.Config]:
    """A small sweep (every config is compiled and timed once per shape, before graph capture)."""
    shapes = [(4, 1024, 4, 3, 1), (8, 512, 4, 3, 1), (8, 1024, 4, 2, 1), (16, 256, 4, 4, 1), (16, 512, 4, 3, 1),
              (16, 512, 8, 3, 1), (32, 256, 4, 3, 1), (32, 512, 8, 2, 1),
              (16, 512, 4, 3, 2), (16, 512, 4, 3, 4), (32, 256, 4, 3, 4), (8, 512, 4, 3, 4), (16, 256, 4, 4, 8)]
    return [triton.Config({"BLOCK_N": n, "BLOCK_K": k, "SPLIT_K": split}, num_warps=warps, num_stages=stages)
            for n, k, warps, stages, split in shapes]


fused_gemv_tuned = triton.autotune(configs=_configs(), key=["M", "N", "K", "NORM", "SILU", "RESIDUAL"])(
    fused_gemv_kernel)
"""The kernel with BLOCK_N/BLOCK_K and warps/stages chosen per shape on the GPU (the CPU interpreter
runs `fused_gemv_kernel` with fixed blocks instead: timing configs there measures nothing)."""
