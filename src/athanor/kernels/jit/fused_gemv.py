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
it lets the next kernel launch as soon as it starts (EARLY: the next kernel's programs wait resident and issue
their first weight loads while this one streams), or else once its weight stream is done, during its epilogue.
"""

from __future__ import annotations

import triton
import triton.language as tl

from athanor.kernels.jit.attention import token_offset
from athanor.kernels.jit.rope import rope_head
from athanor.kernels.jit.tickets import last_of_group


@triton.jit
def fused_gemv_kernel(
    X, X2, W, B, NW, R, Y, WS, TICKETS,
    M, N, K, eps,
    x_s0, x2_s0, w_s0, r_s0, y_s0,
    NORM: tl.constexpr, SILU: tl.constexpr, BIAS: tl.constexpr, RESIDUAL: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr,
    PDL: tl.constexpr, EARLY: tl.constexpr, RSTD_BLOCK: tl.constexpr, EVICT: tl.constexpr = "",
):
    gemv_strip(X, X2, W, B, NW, R, Y, WS, TICKETS, M, N, K, eps, x_s0, x2_s0, w_s0, r_s0, y_s0,
               NORM, SILU, BIAS, RESIDUAL, BLOCK_M, BLOCK_N, BLOCK_K, SPLIT_K, PDL, EARLY, RSTD_BLOCK, X, False, EVICT)


@triton.jit
def gemv_strip(
    X, X2, W, B, NW, R, Y, WS, TICKETS, M, N, K, eps, x_s0, x2_s0, w_s0, r_s0, y_s0,
    NORM: tl.constexpr, SILU: tl.constexpr, BIAS: tl.constexpr, RESIDUAL: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr,
    PDL: tl.constexpr, EARLY: tl.constexpr, RSTD_BLOCK: tl.constexpr, IDS, GATHER: tl.constexpr,
    EVICT: tl.constexpr = "",
):
    """The body of `fused_gemv_kernel`, for the kernels that do more after it (`fused_gemv_rope_kernel`,
    `fused_gemv_route_kernel`, `fused_gemv_argmax_kernel`). Returns (whether this program wrote its strip of Y:
    always without split-K, only the strip's last split with it; the [BLOCK_M, BLOCK_N] values it wrote there).
    GATHER (one row): the input row is X's row IDS[0] (X a table: the token embedding), read after the PDL wait.
    EVICT: the weight loads' L2 eviction policy ("evict_first", say: the weight is read once a step)."""
    if PDL and EARLY:  # let the next kernel's programs become resident now
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
                      other=0.0, eviction_policy=EVICT)
    if PDL:
        tl.extra.cuda.gdc_wait()
    if GATHER:
        X = X + tl.load(IDS).to(tl.int64) * x_s0

    rstd = tl.zeros([BLOCK_M], tl.float32)
    if NORM:
        for m in tl.static_range(BLOCK_M):
            rstd = tl.where(rm == m, input_rstd(X + m * x_s0, K, eps, M - m, RSTD_BLOCK), rstd)

    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    acc = tile_sums(acc, w_first, k_lo + rk, k_hi, X, X2, NW, M, x_s0, x2_s0, rstd, rm, NORM, SILU, BLOCK_M)
    for k0 in range(k_lo + BLOCK_K, k_hi, BLOCK_K):
        ks = k0 + rk
        w = tl.load(w_rows + ks[None, :], mask=n_mask[:, None] & (ks < k_hi)[None, :], other=0.0, eviction_policy=EVICT)
        acc = tile_sums(acc, w, ks, k_hi, X, X2, NW, M, x_s0, x2_s0, rstd, rm, NORM, SILU, BLOCK_M)
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
    partial into the workspace and the strip's last split sums them, then the epilogue. Returns (whether this
    program wrote the strip of Y, what it wrote: zeros where it did not)."""
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = rn < N
    rm = tl.arange(0, BLOCK_M)
    mask = (rm[:, None] < M) & n_mask[None, :]
    if SPLIT_K > 1:
        tile = pid_n * BLOCK_M * BLOCK_N + rm[:, None] * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]
        stride = strips * BLOCK_M * BLOCK_N
        tl.store(WS + pid_k * stride + tile, acc)
        done = last_of_group(TICKETS + pid_n, SPLIT_K)
        out = tl.zeros([BLOCK_M, BLOCK_N], Y.dtype.element_ty)
        if done:
            acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
            for s in tl.static_range(SPLIT_K):
                acc += tl.load(WS + s * stride + tile, cache_modifier=".cg")  # from L2, not a stale L1
            tl.atomic_xchg(TICKETS + pid_n, 0)  # ready for the next launch (CUDA-graph replays included)
            out = gemv_epilogue(acc, B, R, Y, rm, rn, n_mask, mask, r_s0, y_s0, BIAS, RESIDUAL)
    else:
        done = pid_n >= 0
        out = gemv_epilogue(acc, B, R, Y, rm, rn, n_mask, mask, r_s0, y_s0, BIAS, RESIDUAL)
    return done, out


@triton.jit
def fused_gemv_rope_kernel(
    X, W, B, NW, Y, WS, TICKETS, COS, SIN, POS, SLOTS, BT, K_CACHE, V_CACHE, QN, KN, IDS, H,
    M, N, K, eps, x_s0, w_s0, y_s0, c_s0, c_s1, c_s2, bt_s0, NUM_Q_HEADS, NUM_KV_HEADS,
    HEAD_DIM: tl.constexpr, PAGE_SIZE: tl.constexpr, QK_NORM: tl.constexpr, BIAS: tl.constexpr, GATHER: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr,
    PDL: tl.constexpr, EARLY: tl.constexpr, RSTD_BLOCK: tl.constexpr, EVICT: tl.constexpr = "",
):
    """The QKV projection of the RMS-normed residual stream X, then what `rope_kernel` does: the last
    strip of each head to be written (a ticket per head, after the split-K ones) rotates it, q/k-normed
    first under QK_NORM: a q head in place in Y, a k head into K_CACHE at [page, head, row] (the position's page
    BT[slot, position // PAGE_SIZE], row position % PAGE_SIZE); a v head is copied into V_CACHE.
    Y [M, (Hq + 2 Hkv) * HEAD_DIM]; BLOCK_N divides HEAD_DIM.
    GATHER (the first layer, one row): X is the token embedding and the row is X[IDS[0]], which the first
    program also writes into H [1, K] (the residual stream the layer's O projection adds to): no gather launch."""
    done, _ = gemv_strip(X, X, W, B, NW, Y, Y, WS, TICKETS, M, N, K, eps, x_s0, 0, w_s0, 0, y_s0,
                         True, False, BIAS, False, BLOCK_M, BLOCK_N, BLOCK_K, SPLIT_K, PDL, EARLY, RSTD_BLOCK,
                         IDS, GATHER, EVICT)
    if GATHER and tl.program_id(0) == 0 and tl.program_id(1) == 0:
        row = X + tl.load(IDS).to(tl.int64) * x_s0
        for k0 in range(0, K, BLOCK_K):
            ks = k0 + tl.arange(0, BLOCK_K)
            tl.store(H + ks, tl.load(row + ks, mask=ks < K), mask=ks < K)
    if done:
        head = tl.program_id(0) * BLOCK_N // HEAD_DIM
        ticket = TICKETS + tl.num_programs(0) + head
        if last_of_group(ticket, HEAD_DIM // BLOCK_N):
            for m in tl.static_range(BLOCK_M):
                if m < M:
                    pos = tl.load(POS + m)
                    at = token_offset(BT, bt_s0, tl.load(SLOTS + m), pos, c_s0, c_s2, PAGE_SIZE)
                    rope_head(Y + m * y_s0, head, pos, at, COS, SIN, K_CACHE, V_CACHE, QN, KN, eps, c_s1,
                              NUM_Q_HEADS, NUM_KV_HEADS, HEAD_DIM, QK_NORM)
            tl.atomic_xchg(ticket, 0)


@triton.jit
def fused_gemv_argmax_kernel(
    X, W, NW, Y, WS, TICKETS, BEST,
    M, N, K, eps, x_s0, w_s0, y_s0,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr,
    SLOTS: tl.constexpr, PDL: tl.constexpr, EARLY: tl.constexpr, RSTD_BLOCK: tl.constexpr, EVICT: tl.constexpr = "",
):
    """The LM head with the final RMSNorm inside (`fused_gemv_kernel` under NORM) that also folds each row's argmax
    into BEST: every program that writes a strip of logits takes the maximum of its `argmax_keys` into one of the
    row's SLOTS running maxima with a relaxed 64-bit atomic, which it does not wait for (each slot on its own
    128-byte line: one address for every program would serialise them in L2). `argmax_tokens_kernel`, launched
    after it, reads the tokens out. Not a ticket, so that the last program writes the tokens: every program would then
    wait for an atomic's round trip before it exits, and the LM head's weight stream slows by tens of microseconds."""
    done, out = gemv_strip(X, X, W, W, NW, Y, Y, WS, TICKETS, M, N, K, eps, x_s0, 0, w_s0, 0, y_s0,
                           True, False, False, False, BLOCK_M, BLOCK_N, BLOCK_K, SPLIT_K, PDL, EARLY, RSTD_BLOCK,
                           X, False, EVICT)
    if done:
        pid = tl.program_id(0)
        rn = pid * BLOCK_N + tl.arange(0, BLOCK_N)
        rm = tl.arange(0, BLOCK_M)
        tl.atomic_max(BEST + (rm * SLOTS + pid % SLOTS) * 16, tl.max(argmax_keys(out, rn, N), axis=1), mask=rm < M,
                      sem="relaxed")


@triton.jit
def argmax_tokens_kernel(BEST, TOKENS, M, BLOCK_M: tl.constexpr, SLOTS: tl.constexpr, PDL: tl.constexpr):
    """One program: TOKENS[row] from the greatest of the row's SLOTS keys that `fused_gemv_argmax_kernel` left in
    BEST (from L2), which it leaves zero for the next launch."""
    if PDL:  # resident while the LM head streams its weight
        tl.extra.cuda.gdc_wait()
    rm = tl.arange(0, BLOCK_M)
    at = BEST + (rm[:, None] * SLOTS + tl.arange(0, SLOTS)[None, :]) * 16
    best = tl.max(tl.load(at, mask=(rm < M)[:, None], other=0, cache_modifier=".cg"), axis=1)
    tl.store(TOKENS + rm, 2147483647 - (best & 2147483647), mask=rm < M)
    tl.store(at, tl.zeros([BLOCK_M, SLOTS], tl.int64), mask=(rm < M)[:, None])


@triton.jit
def argmax_keys(out, rn, N):
    """Keys [BLOCK_M, BLOCK_N] (int64, > 0) whose maximum names the argmax of the logits `out` at columns rn: the
    value's float order in the high bits, the column reversed in the low 31, so that ties go to the smallest column,
    as torch.argmax's; NaN is never the maximum (as in `argmax_kernel`), -0.0 ties with 0.0; columns >= N key 0."""
    v = out.to(tl.float32)
    v = tl.where(v == v, v, float("-inf"))
    v = tl.where(v == 0.0, 0.0, v)
    bits = v.to(tl.int32, bitcast=True)
    order = (bits ^ ((bits >> 31) & 0x7FFFFFFF)).to(tl.int64) - (-2147483648)  # the float order as int32s, made >= 0
    keys = (order << 31) | (2147483647 - rn.to(tl.int64))[None, :]
    return tl.where((rn < N)[None, :], keys, 0)


@triton.jit
def input_rstd(X_ROW, K, eps, rows_left, RSTD_BLOCK: tl.constexpr):
    """1 / RMS of the K-long row at X_ROW, read RSTD_BLOCK at a time (`dispatch.rstd_block`: the whole row in one load
    where it fits)."""
    return row_rstd(X_ROW, K, eps, tl.arange(0, RSTD_BLOCK), rows_left, RSTD_BLOCK)


@triton.jit
def row_rstd(X_ROW, K, eps, rk, rows_left, BLOCK_K: tl.constexpr):
    """1 / RMS of the K-long row at X_ROW (read whole, BLOCK_K at a time); masked out when rows_left <= 0
    (a padding row of the block). The mask is a block compare: a scalar one is no mask to every interpreter."""
    ss = tl.zeros([BLOCK_K], tl.float32)
    for k0 in range(0, K, BLOCK_K):
        ks = k0 + rk
        h = tl.load(X_ROW + ks, mask=(ks < K) & (ks * 0 < rows_left), other=0.0).to(tl.float32)
        ss += h * h
    return 1.0 / tl.sqrt(tl.sum(ss, axis=0) / K + eps)


@triton.jit
def tile_sums(acc, w, ks, k_hi, X, X2, NW, M, x_s0, x2_s0, rstd, rm,
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
        if NORM:  # the row's 1/RMS picked out of rstd only where it is used
            r = tl.sum(tl.where(rm == m, rstd, 0.0), axis=0)
        part = _row_sums(w, x, up, nw, r, dtype, NORM, SILU)  # [BLOCK_N]
        acc += tl.where(rm[:, None] == m, part[None, :], 0.0)
    return acc


@triton.jit
def stream_row(w, w_rows, n_mask, k_hi, X, X2, NW, r, NORM: tl.constexpr, SILU: tl.constexpr, BLOCK_K: tl.constexpr,
               EVICT: tl.constexpr = ""):
    """The sums [BLOCK_N] of a strip's weight rows w_rows over [0, k_hi) with one input row (X, X2, NW: its
    prologue's operands, r its 1/RMS under NORM), the first tile w loaded: each next tile's weights and input chunks
    are loaded before this one is summed, in registers (Triton pipelines only the loads that feed a tl.dot), so a
    program has two tiles in flight. The same sums in the same order as `tile_sums` tile by tile. EVICT: the weight
    loads' eviction policy."""
    dtype: tl.constexpr = X.dtype.element_ty
    rk = tl.arange(0, BLOCK_K)
    x, up, nw = _row_chunk(X, X2, NW, rk, k_hi, NORM, SILU)
    acc = tl.zeros([w.shape[0]], tl.float32)
    for k0 in range(BLOCK_K, k_hi, BLOCK_K):
        ks = k0 + rk
        w_next = tl.load(w_rows + ks[None, :], mask=n_mask[:, None] & (ks < k_hi)[None, :], other=0.0,
                         eviction_policy=EVICT)
        x_next, up_next, nw_next = _row_chunk(X, X2, NW, ks, k_hi, NORM, SILU)
        acc += _row_sums(w.to(tl.float32), x, up, nw, r, dtype, NORM, SILU)
        w, x, up, nw = w_next, x_next, up_next, nw_next
    return acc + _row_sums(w.to(tl.float32), x, up, nw, r, dtype, NORM, SILU)


@triton.jit
def _row_sums(w, x, up, nw, r, dtype: tl.constexpr, NORM: tl.constexpr, SILU: tl.constexpr):
    """w [BLOCK_N, BLOCK_K] (fp32) times one row's input chunk made by the prologue (`row_input`), summed: [BLOCK_N]."""
    return tl.sum(w * row_input(x, up, nw, r, dtype, NORM, SILU).to(tl.float32)[None, :], axis=1)


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
def gemv_epilogue(acc, B, R, Y, rm, rn, n_mask, mask, r_s0, y_s0, BIAS: tl.constexpr, RESIDUAL: tl.constexpr):
    """Bias, rounding to the model dtype, residual add, store; returns what it stored."""
    dtype = Y.dtype.element_ty
    if BIAS:
        acc += tl.load(B + rn, mask=n_mask, other=0.0).to(tl.float32)[None, :]
    out = acc.to(dtype)
    if RESIDUAL:
        res = tl.load(R + rm[:, None] * r_s0 + rn[None, :], mask=mask, other=0.0)
        out = (out.to(tl.float32) + res.to(tl.float32)).to(dtype)
    tl.store(Y + rm[:, None] * y_s0 + rn[None, :], out, mask=mask)
    return out


def gemv_configs() -> list[triton.Config]:
    """A small sweep (every config is compiled and timed once per shape, before graph capture). The BLOCK_K 1024 and
    2048 ones with a split give a split of K 4096 (an O projection) in one tile, those without one a row of K 2048
    (qwen3-30b-a3b's QKV) or half a row of 4096, the BLOCK_K 4096 ones a row of 4096: all or half of a program's weight
    loaded before its PDL wait."""
    shapes = [(4, 1024, 4, 3, 1), (8, 512, 4, 3, 1), (8, 1024, 4, 2, 1), (16, 256, 4, 4, 1), (16, 512, 4, 3, 1),
              (16, 512, 8, 3, 1), (32, 256, 4, 3, 1), (32, 512, 8, 2, 1),
              (16, 512, 4, 3, 2), (16, 512, 4, 3, 4), (32, 256, 4, 3, 4), (8, 512, 4, 3, 4), (16, 256, 4, 4, 8),
              (8, 1024, 4, 2, 4), (16, 1024, 4, 2, 4), (16, 1024, 8, 2, 4), (32, 1024, 8, 2, 4), (8, 2048, 4, 1, 2),
              (16, 2048, 8, 1, 2), (8, 2048, 4, 1, 1), (16, 2048, 8, 1, 1), (4, 2048, 4, 1, 1), (4, 4096, 4, 1, 1),
              (8, 4096, 8, 1, 1)]
    return [triton.Config({"BLOCK_N": n, "BLOCK_K": k, "SPLIT_K": split}, num_warps=warps, num_stages=stages)
            for n, k, warps, stages, split in shapes]


fused_gemv_tuned = triton.autotune(configs=gemv_configs(), key=["M", "N", "K", "NORM", "SILU", "RESIDUAL", "PDL", "EARLY"])(
    fused_gemv_kernel)
"""The kernel with BLOCK_N/BLOCK_K and warps/stages chosen per shape on the GPU (the CPU interpreter
runs `fused_gemv_kernel` with fixed blocks instead: timing configs there measures nothing)."""
fused_gemv_rope_tuned = triton.autotune(configs=gemv_configs(), key=["M", "N", "K", "QK_NORM", "PDL", "EARLY"])(
    fused_gemv_rope_kernel)
fused_gemv_argmax_tuned = triton.autotune(configs=gemv_configs(), key=["M", "N", "K", "PDL", "EARLY"])(
    fused_gemv_argmax_kernel)
