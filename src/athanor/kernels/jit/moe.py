"""MoE kernels: top-k routing, and the expert GEMM over token pairs grouped in expert blocks.

`moe_gemm_kernel` follows the block layout of `group_by_expert`: the (token, k) pairs are sorted
by expert and each expert's run is padded to a multiple of BLOCK_M, so every BLOCK_M-row block
belongs to one expert and is one tl.dot against that expert's weights, read once per block. The
grid is sized for the worst case and blocks past `num_padded` exit at once (CUDA-graph safe).
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def route_kernel(
    LOGITS, BIAS, IDS, WEIGHTS, l_s0, E,
    TOP_K: tl.constexpr, SOFTMAX: tl.constexpr, RENORM: tl.constexpr, HAS_BIAS: tl.constexpr,
    BLOCK_E: tl.constexpr, BLOCK_K: tl.constexpr,
):
    n = tl.program_id(0)
    e = tl.arange(0, BLOCK_E)
    e_mask = e < E
    logits = tl.load(LOGITS + n * l_s0 + e, mask=e_mask, other=float("-inf")).to(tl.float32)
    if SOFTMAX:
        p = tl.exp(logits - tl.max(logits, axis=0))
        scores = p / tl.sum(p, axis=0)
    else:
        scores = 1.0 / (1.0 + tl.exp(-logits))
    chooser = scores
    if HAS_BIAS:
        chooser = chooser + tl.load(BIAS + e, mask=e_mask, other=0.0).to(tl.float32)
    chooser = tl.where(e_mask, chooser, float("-inf"))
    kk = tl.arange(0, BLOCK_K)
    ids = tl.zeros([BLOCK_K], tl.int64)
    weights = tl.zeros([BLOCK_K], tl.float32)
    for j in tl.static_range(TOP_K):
        best = tl.argmax(chooser, axis=0)
        w = tl.sum(tl.where(e == best, scores, 0.0), axis=0)
        ids = tl.where(kk == j, best.to(tl.int64), ids)
        weights = tl.where(kk == j, w, weights)
        chooser = tl.where(e == best, float("-inf"), chooser)
    if RENORM:
        weights = weights / tl.sum(weights, axis=0)
    tl.store(IDS + n * TOP_K + kk, ids, mask=kk < TOP_K)
    tl.store(WEIGHTS + n * TOP_K + kk, weights, mask=kk < TOP_K)


@triton.jit
def moe_gemm_kernel(
    A, W, C, SORTED_PAIRS, BLOCK_EXPERTS, NUM_PADDED, PAIR_WEIGHTS,
    num_pairs, N, K, a_s0, w_s0, w_s1, c_s0,
    ROWS_PER_A: tl.constexpr, MUL_WEIGHTS: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    # C[pair] = A[pair // ROWS_PER_A] @ W[expert(pair)].T (* weight[pair]);
    # A: [*, K]; W: [E, N, K]; C: [num_pairs, N].
    block = tl.program_id(0)
    pid_n = tl.program_id(1)
    if block * BLOCK_M >= tl.load(NUM_PADDED):
        return
    expert = tl.load(BLOCK_EXPERTS + block).to(tl.int64)
    rm = block * BLOCK_M + tl.arange(0, BLOCK_M)
    pairs = tl.load(SORTED_PAIRS + rm)
    m_mask = pairs < num_pairs  # padding rows hold num_pairs
    a_rows = pairs // ROWS_PER_A
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = rn < N
    rk = tl.arange(0, BLOCK_K)
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for k0 in range(0, K, BLOCK_K):
        ks = k0 + rk
        k_mask = ks < K
        a = tl.load(A + a_rows[:, None].to(tl.int64) * a_s0 + ks[None, :], mask=m_mask[:, None] & k_mask[None, :],
                    other=0.0)
        w = tl.load(W + expert * w_s0 + rn[:, None].to(tl.int64) * w_s1 + ks[None, :],
                    mask=n_mask[:, None] & k_mask[None, :], other=0.0)
        acc += tl.dot(a, tl.trans(w))
    if MUL_WEIGHTS:
        acc = acc * tl.load(PAIR_WEIGHTS + pairs, mask=m_mask, other=0.0)[:, None]
    tl.store(C + pairs[:, None].to(tl.int64) * c_s0 + rn[None, :], acc.to(C.dtype.element_ty),
             mask=m_mask[:, None] & n_mask[None, :])
