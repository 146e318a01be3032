"""Skinny GEMM (a few rows times a weight matrix) with split-K, for small decode batches.

grid (cdiv(N, BLOCK_N), SPLIT_K): each program reduces one K-slice of a BLOCK_N-column strip,
so that even a narrow projection (N = 2048) keeps every SM streaming weights.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def splitk_gemm_kernel(
    X, W, OUT, M, N, K, k_per_split,
    x_s0, w_s0, o_s0, o_s1,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    pid_n = tl.program_id(0)
    split = tl.program_id(1)
    rm = tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    k_start = split * k_per_split
    k_end = tl.minimum(k_start + k_per_split, K)
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for k0 in range(k_start, k_end, BLOCK_K):
        ks = k0 + rk
        k_mask = ks < k_end
        x = tl.load(X + rm[:, None] * x_s0 + ks[None, :], mask=(rm[:, None] < M) & k_mask[None, :], other=0.0)
        w = tl.load(W + rn[:, None].to(tl.int64) * w_s0 + ks[None, :], mask=(rn[:, None] < N) & k_mask[None, :],
                    other=0.0)
        acc += tl.dot(x, tl.trans(w))
    # OUT: [SPLIT_K, M, N] fp32 partial sums (summed by the caller), or [M, N] in the model dtype.
    ptrs = OUT + split * o_s0 + rm[:, None] * o_s1 + rn[None, :]
    tl.store(ptrs, acc.to(OUT.dtype.element_ty), mask=(rm[:, None] < M) & (rn[None, :] < N))
