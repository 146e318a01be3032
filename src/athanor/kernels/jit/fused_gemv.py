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

PDL (programmatic dependent launch, see `athanor.kernels.dispatch.pdl`): the program loads its
first weight tile, which depends on no earlier kernel, before waiting for the previous kernel; and
it lets the next kernel launch as soon as it starts (EARLY, the default: `dispatch.PDL_EARLY`), or else
once its weight stream is done, during its epilogue.
"""

from __future__ import annotations

import triton
import triton.language as tl

from athanor.kernels.jit.moe import rank_logits, route_choice, route_row
from athanor.kernels.jit.rope import rope_head
from athanor.kernels.jit.tickets import last_of_group


@triton.jit
def fused_gemv_kernel(
    X, X2, W, B, NW, R, Y, WS, TICKETS,
    M, N, K, eps,
    x_s0, x2_s0, w_s0, r_s0, y_s0,
    NORM: tl.constexpr, SILU: tl.constexpr, BIAS: tl.constexpr, RESIDUAL: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr,
    PDL: tl.constexpr, EARLY: tl.constexpr, RSTD_BLOCK: tl.constexpr,
):
    gemv_strip(X, X2, W, B, NW, R, Y, WS, TICKETS, M, N, K, eps, x_s0, x2_s0, w_s0, r_s0, y_s0,
               NORM, SILU, BIAS, RESIDUAL, BLOCK_M, BLOCK_N, BLOCK_K, SPLIT_K, PDL, EARLY, RSTD_BLOCK)


@triton.jit
def gemv_strip(
    X, X2, W, B, NW, R, Y, WS, TICKETS, M, N, K, eps, x_s0, x2_s0, w_s0, r_s0, y_s0,
    NORM: tl.constexpr, SILU: tl.constexpr, BIAS: tl.constexpr, RESIDUAL: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr,
    PDL: tl.constexpr, EARLY: tl.constexpr, RSTD_BLOCK: tl.constexpr,
):
    """The body of `fused_gemv_kernel`, for the kernels that do more after it (`fused_gemv_rope_kernel`,
    `fused_gemv_route_kernel`). Returns whether this program wrote its strip of Y: always without split-K,
    only the strip's last split with it."""
    if PDL and EARLY:  # let the next kernel's programs become resident now (see dispatch.PDL_EARLY)
        tl.extra.cuda.gdc_launch_dependents()
    pid_n = tl.program_id(0)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = rn < N
    rk = tl.arange(0, BLOCK_K)
    rm = tl.arange(0, BLOCK_M)
    w_rows = W + rn[:, None].to(tl.int64) * w_s0
    k_lo, k_hi = k_range(tl.program_id(1), K, BLOCK_K, SPLIT_K)
    # The first weight tile needs nothing from earlier kernels: in flight before the wait.
    w_first = tl.load(w_rows + (k_lo + rk)[None, :], mask=n_mask[:, None] & ((k_lo + rk) < k_hi)[None, :],
                      other=0.0)
    if PDL:
        tl.extra.cuda.gdc_wait()

    rstd = tl.zeros([BLOCK_M], tl.float32)
    if NORM:
        for m in tl.static_range(BLOCK_M):
            rstd = tl.where(rm == m, _rstd(X + m * x_s0, K, eps, M - m, BLOCK_K, RSTD_BLOCK), rstd)

    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    acc = _tile(acc, w_first, k_lo + rk, k_hi, X, X2, NW, M, x_s0, x2_s0, rstd, rm, NORM, SILU, BLOCK_M)
    for k0 in range(k_lo + BLOCK_K, k_hi, BLOCK_K):
        ks = k0 + rk
        w = tl.load(w_rows + ks[None, :], mask=n_mask[:, None] & (ks < k_hi)[None, :], other=0.0)
        acc = _tile(acc, w, ks, k_hi, X, X2, NW, M, x_s0, x2_s0, rstd, rm, NORM, SILU, BLOCK_M)
    if PDL:
        tl.extra.cuda.gdc_launch_dependents()  # weights read: the next kernel may start (a no-op after EARLY's)
    return strip_end(acc, pid_n, tl.program_id(1), tl.num_programs(0), B, R, Y, WS, TICKETS, M, N, r_s0, y_s0,
                     BIAS, RESIDUAL, BLOCK_M, BLOCK_N, SPLIT_K)


@triton.jit
def k_range(pid_k, K, BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr):
    """The [k_lo, k_hi) of split pid_k of K (whole BLOCK_K tiles a split, the last one short)."""
    k_per_split = tl.cdiv(tl.cdiv(K, SPLIT_K), BLOCK_K) * BLOCK_K
    k_lo = pid_k * k_per_split
    return k_lo, tl.minimum(k_lo + k_per_split, K)


@triton.jit
def strip_end(acc, pid_n, pid_k, strips, B, R, Y, WS, TICKETS, M, N, r_s0, y_s0,
              BIAS: tl.constexpr, RESIDUAL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
              SPLIT_K: tl.constexpr):
    """The end of strip pid_n (of `strips`), split pid_k, its sums `acc` [BLOCK_M, BLOCK_N] made: with split-K the
    partial into the workspace and the strip's last split sums them, then the epilogue. Returns whether this
    program wrote the strip of Y."""
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = rn < N
    rm = tl.arange(0, BLOCK_M)
    mask = (rm[:, None] < M) & n_mask[None, :]
    if SPLIT_K > 1:
        tile = pid_n * BLOCK_M * BLOCK_N + rm[:, None] * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]
        stride = strips * BLOCK_M * BLOCK_N
        tl.store(WS + pid_k * stride + tile, acc)
        done = last_of_group(TICKETS + pid_n, SPLIT_K)
        if done:
            acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
            for s in tl.static_range(SPLIT_K):
                acc += tl.load(WS + s * stride + tile, cache_modifier=".cg")  # from L2, not a stale L1
            tl.atomic_xchg(TICKETS + pid_n, 0)  # ready for the next launch (CUDA-graph replays included)
            _epilogue(acc, B, R, Y, rm, rn, n_mask, mask, r_s0, y_s0, BIAS, RESIDUAL)
    else:
        done = pid_n >= 0
        _epilogue(acc, B, R, Y, rm, rn, n_mask, mask, r_s0, y_s0, BIAS, RESIDUAL)
    return done


@triton.jit
def fused_gemv_rope_kernel(
    X, W, B, NW, Y, WS, TICKETS, COS, SIN, POS, SLOTS, K_CACHE, V_CACHE, QN, KN,
    M, N, K, eps, x_s0, w_s0, y_s0, c_s0, c_s1, c_s2, NUM_Q_HEADS, NUM_KV_HEADS,
    HEAD_DIM: tl.constexpr, QK_NORM: tl.constexpr, BIAS: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr,
    PDL: tl.constexpr, EARLY: tl.constexpr, RSTD_BLOCK: tl.constexpr,
):
    """The QKV projection of the RMS-normed residual stream X, then what `rope_kernel` does: the last
    strip of each head to be written (a ticket per head, after the split-K ones) rotates it, q/k-normed
    first under QK_NORM: a q head in place in Y, a k head into K_CACHE at [slot, head, position]; a v
    head is copied into V_CACHE. Y [M, (Hq + 2 Hkv) * HEAD_DIM]; BLOCK_N divides HEAD_DIM."""
    done = gemv_strip(X, X, W, B, NW, Y, Y, WS, TICKETS, M, N, K, eps, x_s0, 0, w_s0, 0, y_s0,
                      True, False, BIAS, False, BLOCK_M, BLOCK_N, BLOCK_K, SPLIT_K, PDL, EARLY, RSTD_BLOCK)
    if done:
        head = tl.program_id(0) * BLOCK_N // HEAD_DIM
        ticket = TICKETS + tl.num_programs(0) + head
        if last_of_group(ticket, HEAD_DIM // BLOCK_N):
            for m in tl.static_range(BLOCK_M):
                if m < M:
                    rope_head(Y + m * y_s0, head, tl.load(POS + m), tl.load(SLOTS + m), COS, SIN, K_CACHE, V_CACHE,
                              QN, KN, eps, c_s0, c_s1, c_s2, NUM_Q_HEADS, NUM_KV_HEADS, HEAD_DIM, QK_NORM)
            tl.atomic_xchg(ticket, 0)


@triton.jit
def fused_gemv_route_kernel(
    X, W, NW, Y, WS, TICKETS, RB, IDS, TOPW,
    M, N, K, eps, x_s0, w_s0, y_s0,
    TOP_K: tl.constexpr, SOFTMAX: tl.constexpr, RENORM: tl.constexpr, HAS_BIAS: tl.constexpr,
    BLOCK_E: tl.constexpr, CHUNK: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr,
    PDL: tl.constexpr, EARLY: tl.constexpr, RSTD_BLOCK: tl.constexpr,
):
    """The router's logits Y [M, E] of the RMS-normed residual stream X, then what `route_kernel` does: the
    last strip to be written (a ticket over all strips) picks each row's top-k into IDS and TOPW [M, TOP_K]."""
    done = gemv_strip(X, X, W, W, NW, Y, Y, WS, TICKETS, M, N, K, eps, x_s0, 0, w_s0, 0, y_s0,
                      True, False, False, False, BLOCK_M, BLOCK_N, BLOCK_K, SPLIT_K, PDL, EARLY, RSTD_BLOCK)
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
    PDL: tl.constexpr, EARLY: tl.constexpr, RSTD_BLOCK: tl.constexpr,
):
    """Y = R + X @ W.T (a projection with the residual add: the O projection before a MoE block), then each row's
    share of the MoE router's logits from this strip of Y: SUMS[m, e] += sum over the strip's columns n of
    Y[m, n] * RNW[n] * RW[e, n] (RW: the router [E, N]; RNW: the block's RMSNorm weight), in int64 fixed point
    (x `scale`, rounded to nearest), so the sum does not depend on the order the strips finish in. The RMSNorm's
    scale is one factor per row and comes out of the sum: `route_sums_kernel` applies it and routes."""
    rn = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = rn < N
    # The router's strip (weights: no earlier kernel writes them) is loaded before the projection's wait.
    rw = router_strip(RW, RNW, rn, n_mask, N, E, BLOCK_E)
    done = gemv_strip(X, X, W, W, W, R, Y, WS, TICKETS, M, N, K, 0.0, x_s0, 0, w_s0, r_s0, y_s0,
                      False, False, False, True, BLOCK_M, BLOCK_N, BLOCK_K, SPLIT_K, PDL, EARLY, RSTD_BLOCK)
    if done:
        add_router_share(rw, Y, SUMS, rn, n_mask, M, E, scale, y_s0, BLOCK_E, BLOCK_M)


@triton.jit
def router_strip(RW, RNW, rn, n_mask, N, E, BLOCK_E: tl.constexpr):
    """The router's columns rn [BLOCK_E, BLOCK_N], times the RMSNorm weight's, in fp32 (RW: [E, N]; RNW: [N])."""
    e = tl.arange(0, BLOCK_E)
    rw = tl.load(RW + e[:, None].to(tl.int64) * N + rn[None, :], mask=(e < E)[:, None] & n_mask[None, :], other=0.0)
    return rw.to(tl.float32) * tl.load(RNW + rn, mask=n_mask, other=0.0).to(tl.float32)[None, :]


@triton.jit
def add_router_share(rw, Y, SUMS, rn, n_mask, M, E, scale, y_s0, BLOCK_E: tl.constexpr, BLOCK_M: tl.constexpr):
    """SUMS[m, e] += the fixed-point share of the columns rn of Y's row m in each expert's logit (`router_strip`'s
    rw), for the M rows: the epilogue of a program that has just stored its strip of Y."""
    tl.debug_barrier()  # the strip of Y stored by this program's threads, read back by others of them
    e = tl.arange(0, BLOCK_E)
    for m in tl.static_range(BLOCK_M):
        if m < M:
            # From L2 (.cg): an L1 line holding this strip also holds its neighbours', which other programs of the
            # launch may not have written yet (`moe_block_kernel` reads them from this SM later).
            y = tl.load(Y + m * y_s0 + rn, mask=n_mask, other=0.0, cache_modifier=".cg").to(tl.float32)
            part = tl.sum(rw * y[None, :], axis=1) * scale
            fixed = tl.where(part >= 0, part + 0.5, part - 0.5).to(tl.int64)
            tl.atomic_add(SUMS + m * E + e, fixed, mask=e < E, sem="relaxed")


@triton.jit
def route_sums_kernel(
    SUMS, H, LOGITS, RB, IDS, TOPW, CHOOSERS, E, K, eps, inv_scale, h_s0,
    TOP_K: tl.constexpr, SOFTMAX: tl.constexpr, RENORM: tl.constexpr, HAS_BIAS: tl.constexpr,
    BLOCK_E: tl.constexpr, BLOCK_K: tl.constexpr, CHUNK: tl.constexpr, PDL: tl.constexpr,
):
    """One token's routing from the sums `fused_gemv_router_kernel` left: its logits are rstd(H row) * SUMS row /
    scale, rounded to H's dtype as the router GEMV's output is (stored in LOGITS), then what `route_kernel` does
    (ranked by `rank_logits`, CHUNK rivals at a time from CHOOSERS [rows, BLOCK_E], or all at once with CHUNK 0:
    `gemv.route_chunk`).
    The sums are zeroed for the next launch (CUDA-graph replays included)."""
    if PDL:  # the expert kernel after may become resident now; the sums come from the kernel before
        tl.extra.cuda.gdc_launch_dependents()
        tl.extra.cuda.gdc_wait()
    row = tl.program_id(0).to(tl.int64)
    route_sums_row(SUMS + row * E, H + row * h_s0, LOGITS + row * E, RB, IDS + row * TOP_K, TOPW + row * TOP_K, LOGITS,
                   CHOOSERS + row * BLOCK_E, E, K, eps, inv_scale, TOP_K, SOFTMAX, RENORM, HAS_BIAS, BLOCK_E, BLOCK_K,
                   CHUNK, False)


@triton.jit
def route_sums_row(SUMS, H, LOGITS, RB, IDS, TOPW, RSTD, CHOOSERS, E, K, eps, inv_scale,
                   TOP_K: tl.constexpr, SOFTMAX: tl.constexpr, RENORM: tl.constexpr, HAS_BIAS: tl.constexpr,
                   BLOCK_E: tl.constexpr, BLOCK_K: tl.constexpr, CHUNK: tl.constexpr, STORE_RSTD: tl.constexpr):
    """`route_sums_kernel`'s work for one row (its sums, residual row, logits, ids, weights at SUMS, H, LOGITS, IDS,
    TOPW): the logits, the top-k, the sums zeroed; and the row's 1/RMS stored at RSTD under STORE_RSTD."""
    e = tl.arange(0, BLOCK_E)
    e_mask = e < E
    sums = tl.load(SUMS + e, mask=e_mask, other=0, cache_modifier=".cg")
    rstd = _row_rstd(H, K, eps, tl.arange(0, BLOCK_K), 1, BLOCK_K)
    logits = (sums.to(tl.float32) * inv_scale * rstd).to(LOGITS.dtype.element_ty)
    tl.store(LOGITS + e, logits, mask=e_mask)
    tl.store(SUMS + e, tl.zeros_like(sums), mask=e_mask)
    if STORE_RSTD:
        tl.store(RSTD, rstd)
    rank, chosen, weights = rank_logits(tl.where(e_mask, logits.to(tl.float32), float("-inf")), RB, e, E, TOP_K,
                                        SOFTMAX, RENORM, HAS_BIAS, CHOOSERS, CHUNK)
    tl.store(IDS + rank, e.to(tl.int64), mask=chosen)
    tl.store(TOPW + rank, weights, mask=chosen)


@triton.jit
def _rstd(X_ROW, K, eps, rows_left, BLOCK_K: tl.constexpr, RSTD_BLOCK: tl.constexpr):
    """1 / RMS of the K-long row at X_ROW, read RSTD_BLOCK at a time (`dispatch.rstd_block`: the whole row in one load
    where it fits), or BLOCK_K at a time, as the weight tiles, when RSTD_BLOCK is 0."""
    if RSTD_BLOCK == 0:
        return _row_rstd(X_ROW, K, eps, tl.arange(0, BLOCK_K), rows_left, BLOCK_K)
    else:
        return _row_rstd(X_ROW, K, eps, tl.arange(0, RSTD_BLOCK), rows_left, RSTD_BLOCK)


@triton.jit
def _row_rstd(X_ROW, K, eps, rk, rows_left, BLOCK_K: tl.constexpr):
    """1 / RMS of the K-long row at X_ROW (read whole, BLOCK_K at a time); masked out when rows_left <= 0
    (a padding row of the block). The mask is a block compare: a scalar one is no mask to every interpreter."""
    ss = tl.zeros([BLOCK_K], tl.float32)
    for k0 in range(0, K, BLOCK_K):
        ks = k0 + rk
        h = tl.load(X_ROW + ks, mask=(ks < K) & (ks * 0 < rows_left), other=0.0).to(tl.float32)
        ss += h * h
    return 1.0 / tl.sqrt(tl.sum(ss, axis=0) / K + eps)


@triton.jit
def _tile(acc, w, ks, k_hi, X, X2, NW, M, x_s0, x2_s0, rstd, rm,
          NORM: tl.constexpr, SILU: tl.constexpr, BLOCK_M: tl.constexpr):
    """acc[m, :] += w @ input[m, ks] for each row, the input made by the prologue (norm or SiLU-mul)."""
    dtype = X.dtype.element_ty  # the model's: the prologue rounds as the unfused kernels do
    w = w.to(tl.float32)
    k_mask = ks < k_hi
    nw = 0.0
    if NORM:
        nw = tl.load(NW + ks, mask=k_mask, other=0.0).to(tl.float32)
    for m in tl.static_range(BLOCK_M):
        row_mask = k_mask & (ks * 0 + m < M)  # a block compare: a scalar one is no mask to every interpreter
        x = tl.load(X + m * x_s0 + ks, mask=row_mask, other=0.0)
        up = x
        if SILU:
            up = tl.load(X2 + m * x2_s0 + ks, mask=row_mask, other=0.0)
        r = 0.0
        if NORM:  # the row's 1/RMS picked out of rstd only where it is used (as before row_input: the same code)
            r = tl.sum(tl.where(rm == m, rstd, 0.0), axis=0)
        x = row_input(x, up, nw, r, dtype, NORM, SILU)
        part = tl.sum(w * x.to(tl.float32)[None, :], axis=1)  # [BLOCK_N]
        acc += tl.where(rm[:, None] == m, part[None, :], 0.0)
    return acc


@triton.jit
def stream_row(w, w_rows, n_mask, k_hi, X, X2, NW, r, NORM: tl.constexpr, SILU: tl.constexpr, BLOCK_K: tl.constexpr):
    """The sums [BLOCK_N] of a strip's weight rows w_rows over [0, k_hi) with one input row (X, X2, NW: its
    prologue's operands, r its 1/RMS under NORM), the first tile w loaded: each next tile's weights and input chunks
    are loaded before this one is summed, in registers (Triton pipelines only the loads that feed a tl.dot), so a
    program has two tiles in flight. The same sums in the same order as `_tile` tile by tile."""
    dtype: tl.constexpr = X.dtype.element_ty
    rk = tl.arange(0, BLOCK_K)
    x, up, nw = _row_chunk(X, X2, NW, rk, k_hi, NORM, SILU)
    acc = tl.zeros([w.shape[0]], tl.float32)
    for k0 in range(BLOCK_K, k_hi, BLOCK_K):
        ks = k0 + rk
        w_next = tl.load(w_rows + ks[None, :], mask=n_mask[:, None] & (ks < k_hi)[None, :], other=0.0)
        x_next, up_next, nw_next = _row_chunk(X, X2, NW, ks, k_hi, NORM, SILU)
        acc += tl.sum(w.to(tl.float32) * row_input(x, up, nw, r, dtype, NORM, SILU).to(tl.float32)[None, :], axis=1)
        w, x, up, nw = w_next, x_next, up_next, nw_next
    return acc + tl.sum(w.to(tl.float32) * row_input(x, up, nw, r, dtype, NORM, SILU).to(tl.float32)[None, :], axis=1)


@triton.jit
def _row_chunk(X, X2, NW, ks, k_hi, NORM: tl.constexpr, SILU: tl.constexpr):
    """A row's input chunk at ks (< k_hi), with its up chunk under SILU (else x again) and the norm weight's in fp32
    under NORM (else 0): what `row_input` takes."""
    k_mask = ks < k_hi
    x = tl.load(X + ks, mask=k_mask, other=0.0)
    up = x
    if SILU:
        up = tl.load(X2 + ks, mask=k_mask, other=0.0)
    nw = tl.zeros_like(ks).to(tl.float32)
    if NORM:
        nw = tl.load(NW + ks, mask=k_mask, other=0.0).to(tl.float32)
    return x, up, nw


@triton.jit
def row_input(x, up, nw, r, dtype: tl.constexpr, NORM: tl.constexpr, SILU: tl.constexpr):
    """The prologue on a row's K chunk x, loaded (with its `up` chunk under SILU, the norm weight's nw in fp32 under
    NORM): silu(x) * up, or x * r (the row's 1/RMS) times nw, each rounded to dtype as the unfused kernels round."""
    if SILU:
        g = x.to(tl.float32)
        x = ((g / (1.0 + tl.exp(-g))).to(dtype).to(tl.float32) * up.to(tl.float32)).to(dtype)
    if NORM:
        x = (nw * (x.to(tl.float32) * r).to(dtype).to(tl.float32)).to(dtype)
    return x


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


fused_gemv_tuned = triton.autotune(configs=_configs(), key=["M", "N", "K", "NORM", "SILU", "RESIDUAL", "PDL", "EARLY"])(
    fused_gemv_kernel)
"""The kernel with BLOCK_N/BLOCK_K and warps/stages chosen per shape on the GPU (the CPU interpreter
runs `fused_gemv_kernel` with fixed blocks instead: timing configs there measures nothing)."""
fused_gemv_rope_tuned = triton.autotune(configs=_configs(), key=["M", "N", "K", "QK_NORM", "PDL", "EARLY"])(
    fused_gemv_rope_kernel)
fused_gemv_router_tuned = triton.autotune(configs=_configs(), key=["M", "N", "K", "E", "PDL", "EARLY"],
                                          restore_value=["SUMS"])(fused_gemv_router_kernel)
"""Restores the router sums after timing each config: every timed launch adds into them, and no routing kernel
runs between (without it, the first launch of an unpinned shape routed on the sums of all the timing runs)."""
fused_gemv_route_tuned = triton.autotune(configs=_configs(), key=["M", "N", "K", "TOP_K", "PDL", "EARLY"])(
    fused_gemv_route_kernel)


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
    PREFETCH: tl.constexpr = 0,
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
    w_first = tl.load(w_rows + rk[None, :], mask=n_mask[:, None] & (rk < K)[None, :], other=0.0)
    if PDL:
        if SETTLED:
            tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    row = token if SHARED else pair
    rm = tl.arange(0, 1)
    rstd = tl.zeros([1], tl.float32)
    if NORM:
        rstd += _rstd(X + row * x_s0, K, eps, 1, BLOCK_K, RSTD_BLOCK)
    acc = tl.zeros([1, BLOCK_N], tl.float32)
    if PREFETCH:
        acc += stream_row(w_first, w_rows, n_mask, K, X + row * x_s0, X2 + row * x_s0, NW, tl.sum(rstd, axis=0),
                          NORM, SILU, BLOCK_K)[None, :]
    else:
        acc = _tile(acc, w_first, rk, K, X + row * x_s0, X2 + row * x_s0, NW, 1, 0, 0, rstd, rm, NORM, SILU, 1)
        for k0 in range(BLOCK_K, K, BLOCK_K):
            ks = k0 + rk
            w = tl.load(w_rows + ks[None, :], mask=n_mask[:, None] & (ks < K)[None, :], other=0.0)
            acc = _tile(acc, w, ks, K, X + row * x_s0, X2 + row * x_s0, NW, 1, 0, 0, rstd, rm, NORM, SILU, 1)
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
            _epilogue(acc, Y, R + token * r_s0, Y + token * y_s0, rm, col, n_mask, mask, 0, 0, False, RESIDUAL)
    else:
        out_col = col + N * second.to(tl.int32)
        tl.store(Y + pair * y_s0 + out_col[None, :], acc.to(Y.dtype.element_ty), mask=mask)


@triton.jit
def expert_rows(second, A, a_se, a_sn, B, b_se, b_sn, e, col):
    """Pointers [len(col), 1] to rows col of expert e's weight: A's (strides a_se, a_sn) where `second`, else B's.
    The weight is picked once, as scalars: a select between two pointer tiles can hide their contiguity from the
    compiler, which then loads each tile 2 bytes at a time instead of 16 (Triton 3.9 for sm_90: ld.global.b16 and
    116 registers for the gate/up GEMV's 16 x 256 tile, against ld.global.v4.b32 and 64 this way; Triton 3.6
    vectorised both; `bench/ptx_loads.py`)."""
    base = tl.where(second, A + e * a_se, B + e * b_se)
    return base + col[:, None].to(tl.int64) * tl.where(second, a_sn, b_sn)


def _expert_configs() -> list[triton.Config]:
    # BLOCK_K 1024: a down projection's K (768 for qwen3-30b-a3b) in one tile; the persistent MoE block's phases ran
    # much faster with their K in fewer, larger tiles (`bench/results/moe-block/`).
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
