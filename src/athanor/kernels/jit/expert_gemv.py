"""The routed experts' GEMV for a few decode tokens: each (token, choice) pair streams a strip of its expert's
weight, the expert read by id on the device (no grouping, no sort, no host sync), with the fused GEMV's prologues
(`athanor.kernels.jit.fused_gemv`: the RMSNorm, SiLU-mul) and, for the down projection, the pairs of a token summed
by their routing weights like split-K.
"""

from __future__ import annotations

import triton
import triton.language as tl

from athanor.kernels.jit.fused_gemv import gemv_epilogue, input_rstd, stream_row, tile_sums
from athanor.kernels.jit.moe import route_choice
from athanor.kernels.jit.tickets import last_of_group


@triton.jit
def expert_gemv_kernel(
    X, X2, W, W2, IDS, TOPW, NW, R, Y, WS, TICKETS, RB,
    N, N2, K, E, eps,
    x_s0, w_se, w_sn, w2_se, w2_sn, r_s0, y_s0, ids_s0,
    SHARED: tl.constexpr, NORM: tl.constexpr, SILU: tl.constexpr, SUM: tl.constexpr, RESIDUAL: tl.constexpr,
    TOP_K: tl.constexpr, SETTLED: tl.constexpr,
    ROUTE: tl.constexpr, SOFTMAX: tl.constexpr, RENORM: tl.constexpr, HAS_BIAS: tl.constexpr,
    BLOCK_E: tl.constexpr, CHUNK: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PDL: tl.constexpr, RSTD_BLOCK: tl.constexpr,
    PREFETCH: tl.constexpr = 0, EVICT: tl.constexpr = "",
):
    """A few tokens' routed experts, their ids read on the device: grid (strips of N + N2, tokens * TOP_K).

    Program (s, p) serves pair p = (token p // TOP_K, its choice p % TOP_K) and streams a strip of
    expert IDS[p]'s weight: W's rows for the first cdiv(N, BLOCK_N) strips, W2's for the rest (gate
    and up kept apart, in one launch). Its input row is X's row of the token (SHARED: the token's
    hidden state, RMS-normed with NW under NORM) or of the pair, SiLU-mul'ed with X2's under SILU. Without
    SUM it writes row p of Y [pairs, N + N2]; with SUM (the down projection) the TOP_K programs of a token's strip are
    reduced like split-K, each partial scaled by its routing weight TOPW[p] in fp32, and the last one
    writes the token's row of Y [tokens, N], plus the residual under RESIDUAL.

    ROUTE: IDS is the router's logits [tokens, E] (row stride ids_s0), not ids: the program ranks its token's E
    logits itself and takes its choice's expert and weight (`route_choice`: what the routing kernel would have
    stored), so routing needs no launch of its own.

    PREFETCH (a config's choice): each weight tile and input chunk is loaded before the previous tile is summed
    (`stream_row`), so two tiles a program are in flight instead of one; the same sums in the same order.

    PDL: the program waits for the previous kernel before reading the ids (they come from the routing
    kernel, or the logits from the router's GEMV), unless SETTLED (see `expert_gemv`): then it reads them and
    its first weight tile first.
    EVICT: the weight loads' L2 eviction policy ("evict_first": read once a step, they give way first to what the step
    reads again; `expert_gemv(evict_first=True)`).
    Either way it lets the next kernel start right after its wait, so a SETTLED launch after this one
    finds every kernel before this one finished."""
    if PDL and not SETTLED:
        tl.extra.cuda.gdc_wait()
    pid_n = tl.program_id(0)
    pair = tl.program_id(1)
    token = pair // TOP_K
    strips1 = tl.cdiv(N, BLOCK_N)
    second = pid_n >= strips1
    col = (pid_n - strips1 * second.to(tl.int32)) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = col < tl.where(second, N2, N)
    if ROUTE:
        e, route_w = route_choice(IDS + token * ids_s0, RB, pair % TOP_K, E, TOP_K, SOFTMAX, RENORM, HAS_BIAS,
                                  BLOCK_E, CHUNK)
        e = e.to(tl.int64)
    else:
        e = tl.load(IDS + pair, cache_modifier=".cg").to(tl.int64)  # from L2: written by another launch
    w_rows = expert_rows(second, W2, w2_se, w2_sn, W, w_se, w_sn, e, col)
    rk = tl.arange(0, BLOCK_K)
    w_first = tl.load(w_rows + rk[None, :], mask=n_mask[:, None] & (rk < K)[None, :], other=0.0, eviction_policy=EVICT)
    if PDL:
        if SETTLED:
            tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    row = token if SHARED else pair
    rm = tl.arange(0, 1)
    rstd = tl.zeros([1], tl.float32)
    if NORM:
        rstd += input_rstd(X + row * x_s0, K, eps, 1, RSTD_BLOCK)
    acc = tl.zeros([1, BLOCK_N], tl.float32)
    if PREFETCH:
        acc += stream_row(w_first, w_rows, n_mask, K, X + row * x_s0, X2 + row * x_s0, NW, tl.sum(rstd, axis=0),
                          NORM, SILU, BLOCK_K, EVICT)[None, :]
    else:
        acc = tile_sums(acc, w_first, rk, K, X + row * x_s0, X2 + row * x_s0, NW, 1, 0, 0, rstd, rm, NORM, SILU, 1)
        for k0 in range(BLOCK_K, K, BLOCK_K):
            ks = k0 + rk
            w = tl.load(w_rows + ks[None, :], mask=n_mask[:, None] & (ks < K)[None, :], other=0.0, eviction_policy=EVICT)
            acc = tile_sums(acc, w, ks, K, X + row * x_s0, X2 + row * x_s0, NW, 1, 0, 0, rstd, rm, NORM, SILU, 1)
    mask = n_mask[None, :]
    if SUM:
        if ROUTE:
            acc *= route_w
        else:
            acc *= tl.load(TOPW + pair)
        strips = tl.num_programs(0)
        tile = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]
        tl.store(WS + pair * strips * BLOCK_N + tile, acc)
        if last_of_group(TICKETS + token * strips + pid_n, TOP_K):
            acc = tl.zeros([1, BLOCK_N], tl.float32)
            for j in tl.static_range(TOP_K):
                acc += tl.load(WS + (token * TOP_K + j) * strips * BLOCK_N + tile, cache_modifier=".cg")
            tl.atomic_xchg(TICKETS + token * strips + pid_n, 0)
            gemv_epilogue(acc, Y, R + token * r_s0, Y + token * y_s0, rm, col, n_mask, mask, 0, 0, False, RESIDUAL)
    else:
        out_col = col + N * second.to(tl.int32)
        tl.store(Y + pair * y_s0 + out_col[None, :], acc.to(Y.dtype.element_ty), mask=mask)


@triton.jit
def expert_rows(second, A, a_se, a_sn, B, b_se, b_sn, e, col):
    """Pointers [len(col), 1] to rows col of expert e's weight: A's (strides a_se, a_sn) where `second`, else B's.
    The weight is picked once, as scalars: a select between two pointer tiles can hide their contiguity from the
    compiler, which then loads each tile 2 bytes at a time instead of 16 (Triton 3.9 for sm_90: ld.global.b16 and
    116 registers for the gate/up GEMV's 16 x 256 tile, against ld.global.v4.b32 and 64 this way)."""
    base = tl.where(second, A + e * a_se, B + e * b_se)
    return base + col[:, None].to(tl.int64) * tl.where(second, a_sn, b_sn)


def _expert_configs() -> list[triton.Config]:
    # BLOCK_K 1024: a down projection's K (768 for qwen3-30b-a3b) in one tile; a K in fewer, larger tiles leaves fewer
    # loads to drain at each unit of work.
    # PREFETCH 1: two tiles in flight a program (`stream_row`) for a few more registers.
    shapes = [(8, 512, 4, 3, 0), (16, 256, 4, 3, 0), (16, 512, 4, 3, 0), (32, 256, 4, 3, 0), (32, 512, 4, 2, 0),
              (64, 128, 4, 3, 0), (8, 1024, 4, 2, 0), (16, 1024, 4, 2, 0),
              (8, 512, 4, 3, 1), (16, 256, 4, 3, 1), (16, 512, 4, 3, 1), (32, 256, 4, 3, 1),
              (32, 256, 8, 3, 1), (64, 256, 8, 3, 1), (64, 128, 4, 3, 1), (32, 512, 8, 2, 1), (32, 128, 4, 3, 1),
              (64, 128, 8, 3, 1), (32, 256, 2, 3, 1)]
    return [triton.Config({"BLOCK_N": n, "BLOCK_K": k, "PREFETCH": prefetch}, num_warps=warps, num_stages=stages)
            for n, k, warps, stages, prefetch in shapes]


expert_gemv_tuned = triton.autotune(configs=_expert_configs(),
                                    key=["N", "N2", "K", "SHARED", "NORM", "SILU", "SUM", "TOP_K", "SETTLED", "ROUTE", "PDL"])(
    expert_gemv_kernel)
"""`expert_gemv_kernel` with blocks chosen per shape on the GPU."""
