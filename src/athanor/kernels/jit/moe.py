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
def _route_scores(LOGITS, BIAS, e, e_mask, m, denom, SOFTMAX: tl.constexpr, HAS_BIAS: tl.constexpr):
    """`_scores` of the experts e, their logits loaded from LOGITS."""
    # From L2 (.cg): the logits may have been written by other programs of the same launch (`route_row`).
    logits = tl.load(LOGITS + e, mask=e_mask, other=float("-inf"), cache_modifier=".cg").to(tl.float32)
    return _scores(logits, BIAS, e, e_mask, m, denom, SOFTMAX, HAS_BIAS)


@triton.jit
def _scores(logits, BIAS, e, e_mask, m, denom, SOFTMAX: tl.constexpr, HAS_BIAS: tl.constexpr):
    """(scores, chooser) of the experts e: softmax (given the row's max m and sum of exps denom) or
    sigmoid of the logits; the chooser adds the selection bias and is -inf off e_mask."""
    if SOFTMAX:  # noqa: SIM108 (a statement if on a constexpr: Triton compiles one branch)
        scores = tl.exp(logits - m) / denom
    else:
        scores = 1.0 / (1.0 + tl.exp(-logits))
    chooser = scores
    if HAS_BIAS:
        chooser = chooser + tl.load(BIAS + e, mask=e_mask, other=0.0).to(tl.float32)
    return scores, tl.where(e_mask, chooser, float("-inf"))


@triton.jit
def _picks(rank, scores, e_mask, TOP_K: tl.constexpr, RENORM: tl.constexpr):
    """(which experts are chosen, their routing weights) from their ranks and scores."""
    chosen = (rank < TOP_K) & e_mask
    weights = scores
    if RENORM:
        weights = weights / tl.sum(tl.where(chosen, scores, 0.0), axis=0)
    return chosen, weights


@triton.jit
def _softmax_stats(logits, SOFTMAX: tl.constexpr):
    """(max, sum of exp(logit - max)) of a row's logits ([BLOCK_E] fp32, -inf past E) for a softmax; (0, 1) unused."""
    m = 0.0
    denom = 1.0
    if SOFTMAX:
        m = tl.max(logits, axis=0)
        denom = tl.sum(tl.exp(logits - m), axis=0)
    return m, denom


@triton.jit
def _beaten(chooser, e, rival, j):
    """For each expert e (its chooser), how many of the rivals j (theirs) beat it: a higher chooser, or an equal one at
    a lower index (argmax's tie break)."""
    beats = (rival[None, :] > chooser[:, None]) | ((rival[None, :] == chooser[:, None]) & (j[None, :] < e[:, None]))
    return tl.sum(beats.to(tl.int32), axis=1)


@triton.jit
def _max_rounds(chooser, e, TOP_K: tl.constexpr):
    """The ranks `_beaten` counts, for the TOP_K best (TOP_K for the rest), in TOP_K rounds of one max each: O(E k)
    work, not O(E^2). Each expert's key packs its chooser's order as an int32 (a float's bits, the magnitude's bits
    flipped where negative) above its index reversed (argmax's tie break: the lower index wins), so keys are distinct,
    non-negative, and the max names the winner alone; it is then struck out (-1). -0.0 is made +0.0 first: they are
    equal choosers, as `_beaten` compares them. BLOCK_E <= 65536. Less work is not less time here: the routing
    kernel's time is latency, not arithmetic, and its TOP_K dependent reductions are slower than counting ranks."""
    bits = (chooser + 0.0).to(tl.int32, bitcast=True)
    order = bits ^ ((bits >> 31) & 0x7FFFFFFF)  # ordered as the floats are, -inf and negatives included
    keys = ((order.to(tl.int64) + 2147483648) << 16) | (65535 - e).to(tl.int64)
    rank = tl.zeros_like(e) + TOP_K
    for r in tl.static_range(TOP_K):
        hit = keys == tl.max(keys, axis=0)
        rank = tl.where(hit, r, rank)
        keys = tl.where(hit, -1, keys)
    return rank


@triton.jit
def route_kernel(
    LOGITS, BIAS, IDS, WEIGHTS, l_s0, E,
    TOP_K: tl.constexpr, SOFTMAX: tl.constexpr, RENORM: tl.constexpr, HAS_BIAS: tl.constexpr,
    BLOCK_E: tl.constexpr, CHUNK: tl.constexpr, PDL: tl.constexpr,
):
    # One program per token. Top-k by rank, not by k rounds of argmax: an expert's rank is the number
    # of experts that beat it (a higher chooser, or an equal one at a lower index, as argmax breaks
    # ties), counted against CHUNK experts at a time; the k of rank < k are stored at their rank, so
    # the ids come out in descending order, as torch.topk's. Two reductions instead of 2k, each a
    # cross-warp round trip.
    if PDL:  # the expert kernel after may become resident now; the logits come from the kernel before
        tl.extra.cuda.gdc_launch_dependents()
        tl.extra.cuda.gdc_wait()
    row = tl.program_id(0).to(tl.int64)
    route_row(LOGITS + row * l_s0, BIAS, IDS + row * TOP_K, WEIGHTS + row * TOP_K, E, TOP_K, SOFTMAX, RENORM,
              HAS_BIAS, BLOCK_E, CHUNK)


@triton.jit
def route_row(ROW, BIAS, IDS, WEIGHTS, E, TOP_K: tl.constexpr, SOFTMAX: tl.constexpr, RENORM: tl.constexpr,
              HAS_BIAS: tl.constexpr, BLOCK_E: tl.constexpr, CHUNK: tl.constexpr):
    """One token's routing: its E logits at ROW -> its top-k ids and weights at IDS, WEIGHTS (see `route_kernel`)."""
    e, rank, chosen, weights = _ranked(ROW, BIAS, E, TOP_K, SOFTMAX, RENORM, HAS_BIAS, BLOCK_E, CHUNK)
    tl.store(IDS + rank, e.to(tl.int64), mask=chosen)
    tl.store(WEIGHTS + rank, weights, mask=chosen)


@triton.jit
def route_choice(ROW, BIAS, choice, E, TOP_K: tl.constexpr, SOFTMAX: tl.constexpr, RENORM: tl.constexpr,
                 HAS_BIAS: tl.constexpr, BLOCK_E: tl.constexpr, CHUNK: tl.constexpr):
    """(expert id, weight) of one token's choice-th pick (0 = the highest) from its E logits at ROW: what
    `route_row` stores at IDS[choice], WEIGHTS[choice], for a program that needs only that pick."""
    e, rank, chosen, weights = _ranked(ROW, BIAS, E, TOP_K, SOFTMAX, RENORM, HAS_BIAS, BLOCK_E, CHUNK)
    mine = chosen & (rank == choice)
    return tl.sum(tl.where(mine, e, 0), axis=0), tl.sum(tl.where(mine, weights, 0.0), axis=0)


@triton.jit
def _ranked(ROW, BIAS, E, TOP_K: tl.constexpr, SOFTMAX: tl.constexpr, RENORM: tl.constexpr, HAS_BIAS: tl.constexpr,
            BLOCK_E: tl.constexpr, CHUNK: tl.constexpr):
    """(experts, their ranks, which are chosen, their routing weights), each [BLOCK_E], for the E logits at ROW."""
    e = tl.arange(0, BLOCK_E)
    e_mask = e < E
    m, denom = _softmax_stats(tl.load(ROW + e, mask=e_mask, other=float("-inf"), cache_modifier=".cg").to(tl.float32),
                              SOFTMAX)
    scores, chooser = _route_scores(ROW, BIAS, e, e_mask, m, denom, SOFTMAX, HAS_BIAS)
    rank = tl.zeros([BLOCK_E], tl.int32)
    for j0 in tl.static_range(0, BLOCK_E, CHUNK):
        j = j0 + tl.arange(0, CHUNK)
        _, other = _route_scores(ROW, BIAS, j, j < E, m, denom, SOFTMAX, HAS_BIAS)
        rank += _beaten(chooser, e, other, j)
    chosen, weights = _picks(rank, scores, e_mask, TOP_K, RENORM)
    return e, rank, chosen, weights


@triton.jit
def rank_logits(logits, BIAS, e, E, TOP_K: tl.constexpr, SOFTMAX: tl.constexpr, RENORM: tl.constexpr,
                HAS_BIAS: tl.constexpr, CHOOSERS, CHUNK: tl.constexpr):
    """What `_ranked` returns but the experts, for logits already in registers ([BLOCK_E] fp32, -inf past E, at
    experts e = arange(BLOCK_E)). CHUNK 0: the rank counted over the whole [BLOCK_E, BLOCK_E] comparison at once, with
    no round trip through memory; CHUNK < 0: TOP_K rounds of one max (`_max_rounds`). Else the choosers are stored at
    CHOOSERS [BLOCK_E] fp32 (the program's own scratch) and the rivals read back CHUNK at a time in a loop that is not
    unrolled: a fraction of the registers and of the code, and the fastest of the three for the routing kernel on the
    router sums (`linear_route(route_chunk=)`) and in the persistent MoE block."""
    e_mask = e < E
    m, denom = _softmax_stats(logits, SOFTMAX)
    scores, chooser = _scores(logits, BIAS, e, e_mask, m, denom, SOFTMAX, HAS_BIAS)
    if CHUNK == 0:
        rank = _beaten(chooser, e, chooser, e)
    elif CHUNK < 0:
        rank = _max_rounds(chooser, e, TOP_K)
    else:
        tl.store(CHOOSERS + e, chooser)
        tl.debug_barrier()  # every thread's choosers stored before any is read back
        rank = tl.zeros_like(e)
        for j0 in range(0, E, CHUNK):  # E, not BLOCK_E: a runtime bound, a loop the compiler does not unroll
            j = j0 + tl.arange(0, CHUNK)
            rank += _beaten(chooser, e, tl.load(CHOOSERS + j), j)
        tl.debug_barrier()  # read back before the scratch is written again (the next row's)
    chosen, weights = _picks(rank, scores, e_mask, TOP_K, RENORM)
    return rank, chosen, weights


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
