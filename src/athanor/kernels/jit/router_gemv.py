"""The MoE router's GEMV with the routing folded in, and the O projection that sums the router's logits as it goes.

Both are `gemv_strip` (`athanor.kernels.jit.fused_gemv`) with more after it: `fused_gemv_route_kernel` ranks the
logits in its last strip (`router_topk`); `fused_gemv_router_kernel` adds each strip's share of every expert's logit
into fixed-point sums, which `route_sums_kernel` turns into logits and routes (`linear_route`).
"""

from __future__ import annotations

import triton
import triton.language as tl

from athanor.kernels.jit.fused_gemv import gemv_configs, gemv_strip, row_rstd
from athanor.kernels.jit.moe import rank_logits, route_row
from athanor.kernels.jit.tickets import last_of_group


@triton.jit
def fused_gemv_route_kernel(
    X, W, NW, Y, WS, TICKETS, RB, IDS, TOPW,
    M, N, K, eps, x_s0, w_s0, y_s0,
    TOP_K: tl.constexpr, SOFTMAX: tl.constexpr, RENORM: tl.constexpr, HAS_BIAS: tl.constexpr,
    BLOCK_E: tl.constexpr, CHUNK: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr,
    PDL: tl.constexpr, EARLY: tl.constexpr, RSTD_BLOCK: tl.constexpr, EVICT: tl.constexpr = "",
):
    """The router's logits Y [M, E] of the RMS-normed residual stream X, then what `route_kernel` does: the
    last strip to be written (a ticket over all strips) picks each row's top-k into IDS and TOPW [M, TOP_K]."""
    done, _ = gemv_strip(X, X, W, W, NW, Y, Y, WS, TICKETS, M, N, K, eps, x_s0, 0, w_s0, 0, y_s0,
                         True, False, False, False, BLOCK_M, BLOCK_N, BLOCK_K, SPLIT_K, PDL, EARLY, RSTD_BLOCK,
                         X, False, EVICT)
    if done:
        ticket = TICKETS + tl.num_programs(0)
        if last_of_group(ticket, tl.num_programs(0)):
            for m in tl.static_range(BLOCK_M):
                if m < M:
                    route_row(Y + m * y_s0, RB, IDS + m * TOP_K, TOPW + m * TOP_K, N, TOP_K, SOFTMAX, RENORM,
                              HAS_BIAS, BLOCK_E, CHUNK)
            tl.atomic_xchg(ticket, 0)


@triton.jit
def fused_gemv_router_kernel(
    X, W, R, Y, WS, TICKETS, RW, RNW, SUMS,
    M, N, K, E, scale, x_s0, w_s0, r_s0, y_s0,
    BLOCK_E: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr,
    PDL: tl.constexpr, EARLY: tl.constexpr, RSTD_BLOCK: tl.constexpr, EVICT: tl.constexpr = "",
    SPREAD: tl.constexpr = 1,
):
    """Y = R + X @ W.T (a projection with the residual add: the O projection before a MoE block), then each row's
    share of the MoE router's logits from this strip of Y: SUMS[m, e] += sum over the strip's columns n of
    Y[m, n] * RNW[n] * RW[e, n] (RW: the router [E, N]; RNW: the block's RMSNorm weight), in int64 fixed point
    (x `scale`, rounded to nearest), so the sum does not depend on the order the strips finish in. The RMSNorm's
    scale is one factor per row and comes out of the sum: `route_sums_kernel` applies it and routes. SUMS[m, e] is at
    SUMS + (m * E + e) * SPREAD (see `add_router_share`)."""
    rn = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = rn < N
    # The router's strip (weights: no earlier kernel writes them) is loaded before the projection's wait.
    rw = router_strip(RW, RNW, rn, n_mask, N, E, BLOCK_E)
    done, _ = gemv_strip(X, X, W, W, W, R, Y, WS, TICKETS, M, N, K, 0.0, x_s0, 0, w_s0, r_s0, y_s0,
                         False, False, False, True, BLOCK_M, BLOCK_N, BLOCK_K, SPLIT_K, PDL, EARLY, RSTD_BLOCK,
                         X, False, EVICT)
    if done:
        add_router_share(rw, Y, SUMS, rn, n_mask, M, E, scale, y_s0, BLOCK_E, BLOCK_M, SPREAD)


@triton.jit
def router_strip(RW, RNW, rn, n_mask, N, E, BLOCK_E: tl.constexpr):
    """The router's columns rn [BLOCK_E, BLOCK_N], times the RMSNorm weight's, in fp32 (RW: [E, N]; RNW: [N])."""
    e = tl.arange(0, BLOCK_E)
    rw = tl.load(RW + e[:, None].to(tl.int64) * N + rn[None, :], mask=(e < E)[:, None] & n_mask[None, :], other=0.0)
    return rw.to(tl.float32) * tl.load(RNW + rn, mask=n_mask, other=0.0).to(tl.float32)[None, :]


@triton.jit
def add_router_share(rw, Y, SUMS, rn, n_mask, M, E, scale, y_s0, BLOCK_E: tl.constexpr, BLOCK_M: tl.constexpr,
                     SPREAD: tl.constexpr = 1):
    """SUMS[m, e] += the fixed-point share of the columns rn of Y's row m in each expert's logit (`router_strip`'s
    rw), for the M rows: the epilogue of a program that has just stored its strip of Y. SUMS[m, e] is at
    SUMS + (m * E + e) * SPREAD: with SPREAD 16 each sum has its own 128-byte line, so the launch's atomics (every
    program adds to every sum) spread over L2's slices instead of queueing at the few that hold E packed sums."""
    tl.debug_barrier()  # the strip of Y stored by this program's threads, read back by others of them
    e = tl.arange(0, BLOCK_E)
    for m in tl.static_range(BLOCK_M):
        if m < M:
            # From L2 (.cg): an L1 line holding this strip also holds its neighbours', which other programs of the
            # launch may not have written yet (`moe_block_kernel` reads them from this SM later).
            y = tl.load(Y + m * y_s0 + rn, mask=n_mask, other=0.0, cache_modifier=".cg").to(tl.float32)
            part = tl.sum(rw * y[None, :], axis=1) * scale
            fixed = tl.where(part >= 0, part + 0.5, part - 0.5).to(tl.int64)
            tl.atomic_add(SUMS + (m * E + e) * SPREAD, fixed, mask=e < E, sem="relaxed")


@triton.jit
def route_sums_kernel(
    SUMS, H, LOGITS, RB, IDS, TOPW, CHOOSERS, E, K, eps, inv_scale, h_s0,
    TOP_K: tl.constexpr, SOFTMAX: tl.constexpr, RENORM: tl.constexpr, HAS_BIAS: tl.constexpr,
    BLOCK_E: tl.constexpr, BLOCK_K: tl.constexpr, CHUNK: tl.constexpr, PDL: tl.constexpr, SPREAD: tl.constexpr = 1,
):
    """One token's routing from the sums `fused_gemv_router_kernel` left: its logits are rstd(H row) * SUMS row /
    scale, rounded to H's dtype as the router GEMV's output is (stored in LOGITS), then what `route_kernel` does
    (ranked by `rank_logits`, CHUNK rivals at a time from CHOOSERS [rows, BLOCK_E], or all at once with CHUNK 0:
    `linear_route(route_chunk=)`).
    The sums are zeroed for the next launch (CUDA-graph replays included)."""
    if PDL:  # the expert kernel after may become resident now; the sums come from the kernel before
        tl.extra.cuda.gdc_launch_dependents()
        tl.extra.cuda.gdc_wait()
    row = tl.program_id(0).to(tl.int64)
    route_sums_row(SUMS + row * E * SPREAD, H + row * h_s0, LOGITS + row * E, RB, IDS + row * TOP_K, TOPW + row * TOP_K, LOGITS,
                   CHOOSERS + row * BLOCK_E, E, K, eps, inv_scale, TOP_K, SOFTMAX, RENORM, HAS_BIAS, BLOCK_E, BLOCK_K,
                   CHUNK, False, SPREAD)


@triton.jit
def route_sums_row(SUMS, H, LOGITS, RB, IDS, TOPW, RSTD, CHOOSERS, E, K, eps, inv_scale,
                   TOP_K: tl.constexpr, SOFTMAX: tl.constexpr, RENORM: tl.constexpr, HAS_BIAS: tl.constexpr,
                   BLOCK_E: tl.constexpr, BLOCK_K: tl.constexpr, CHUNK: tl.constexpr, STORE_RSTD: tl.constexpr,
                   SPREAD: tl.constexpr = 1):
    """`route_sums_kernel`'s work for one row (its sums, residual row, logits, ids, weights at SUMS, H, LOGITS, IDS,
    TOPW): the logits, the top-k, the sums zeroed; and the row's 1/RMS stored at RSTD under STORE_RSTD. Expert e's
    sum is at SUMS + e * SPREAD (`add_router_share`)."""
    e = tl.arange(0, BLOCK_E)
    e_mask = e < E
    sums = tl.load(SUMS + e * SPREAD, mask=e_mask, other=0, cache_modifier=".cg")
    rstd = row_rstd(H, K, eps, tl.arange(0, BLOCK_K), 1, BLOCK_K)
    logits = (sums.to(tl.float32) * inv_scale * rstd).to(LOGITS.dtype.element_ty)
    tl.store(LOGITS + e, logits, mask=e_mask)
    tl.store(SUMS + e * SPREAD, tl.zeros_like(sums), mask=e_mask)
    if STORE_RSTD:
        tl.store(RSTD, rstd)
    rank, chosen, weights = rank_logits(tl.where(e_mask, logits.to(tl.float32), float("-inf")), RB, e, E, TOP_K,
                                        SOFTMAX, RENORM, HAS_BIAS, CHOOSERS, CHUNK)
    tl.store(IDS + rank, e.to(tl.int64), mask=chosen)
    tl.store(TOPW + rank, weights, mask=chosen)


fused_gemv_router_tuned = triton.autotune(configs=gemv_configs(), key=["M", "N", "K", "E", "PDL", "EARLY"],
                                          restore_value=["SUMS"])(fused_gemv_router_kernel)
"""Restores the router sums after timing each config: every timed launch adds into them, and no routing kernel
runs between (without it, the first launch of an unpinned shape routed on the sums of all the timing runs)."""
fused_gemv_route_tuned = triton.autotune(configs=gemv_configs(), key=["M", "N", "K", "TOP_K", "PDL", "EARLY"])(
    fused_gemv_route_kernel)
