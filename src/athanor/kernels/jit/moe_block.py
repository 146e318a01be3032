"""A MoE block at batch 1 in one persistent launch: the O projection, the router, routing and the routed experts.

At batch 1 the block is four launches a layer (the O projection summing the router's logits, the routing kernel,
the experts' gate/up GEMV, their down GEMV), which take well over the time their weight bytes need: each boundary
costs a ramp (a kernel's programs start cold, its first loads wait on the wait for the one before) and a tail (the
last programs of a wave run alone). Here one grid of a few programs per SM, all resident
at once, walks the three GEMVs in turn, each program taking every P-th unit of work, with grid-wide synchronisation
between them (atomic counts and flags spun on from L2) where the kernel boundaries were.

- Phase 1: the O projection, h = R + X @ WO.T, strip by strip (split-K as `strip_end`), each strip's share of the
  router's logits added into int64 fixed-point sums (`add_router_share`, as `fused_gemv_router_kernel`).
- The last program to arrive routes (`route_sums_row`, as `route_sums_kernel`: the logits, ids, weights and the
  row's 1/RMS stored, the sums zeroed) and raises a flag the others wait on. Phase 2: the chosen experts' gate and up
  rows of the RMS-normed input, as `expert_gemv_kernel` (SHARED, NORM) computes them, into GU [pairs, 2 * NI].
- Barrier (the programs' first down tiles loaded before it). Phase 3: the down projection: a strip of the output sums
  its token's experts itself (SiLU-mul of GU's halves, scaled by the routing weight, in fp32 in the order of
  `expert_gemv_kernel`'s split-K sum), plus the residual h: no workspace, no ticket.
The last program out resets the counters for the next launch (CUDA-graph replays included).

Each phase runs a unit's K tiles and the next unit's in one loop, with the next tile's weights (and in phases 2 and 3
its input chunk) loaded before this one is summed: a program's loads do not drain at each unit. Every result matches
the four-launch path bit for bit for the same blocks (the same operations in the same order: a unit test on the CPU
interpreter).

The synchronisation needs every program resident at once; `athanor.kernels.moe_block` sizes the grid from the
compiled kernel's registers and shared memory, and a program that waits SPINS polls without the others arriving
gives up and raises the flag at BAR[2] (wrong results, a failed test, instead of a hung GPU). The interpreter runs
programs one after another, so there (PHASE 1, 2, 3) each phase is a launch of its own and program 0 routes.
"""

from __future__ import annotations

import triton
import triton.language as tl

from athanor.kernels.jit.expert_gemv import expert_rows
from athanor.kernels.jit.fused_gemv import k_range, row_input, strip_end, tile_sums
from athanor.kernels.jit.router_gemv import add_router_share, route_sums_row, router_strip
from athanor.kernels.jit.tickets import last_of_group


@triton.jit
def moe_block_kernel(
    X, WO, R, H, WS, TICKETS, RW, NW, SUMS, LOGITS, RB, IDS, TOPW, WG, WU, GU, WD, OUT, BAR, STAMPS, SCRATCH, RSTDS,
    M, N, K, E, NI, eps, scale, inv_scale,
    x_s0, wo_s0, r_s0, h_s0, wg_se, wg_sn, wu_se, wu_sn, gu_s0, wd_se, wd_sn, out_s0,
    TOP_K: tl.constexpr, SOFTMAX: tl.constexpr, RENORM: tl.constexpr, HAS_BIAS: tl.constexpr, BLOCK_E: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_P: tl.constexpr,
    BLOCK_N1: tl.constexpr, BLOCK_K1: tl.constexpr, SPLIT_K1: tl.constexpr,
    BLOCK_N2: tl.constexpr, BLOCK_K2: tl.constexpr, BLOCK_N3: tl.constexpr, BLOCK_K3: tl.constexpr,
    RANK_CHUNK: tl.constexpr, PHASE: tl.constexpr, PDL: tl.constexpr, RSTD_BLOCK: tl.constexpr,
    SPINS: tl.constexpr, TIMING: tl.constexpr,
):
    """OUT = H + the routed experts of rms_norm(H), H = R + X @ WO.T, for M <= BLOCK_M rows (see the module).

    X [M, K], WO [N, K], R/H/OUT [M, N]; RW [E, N] the router, NW [N] the block's RMSNorm weight, SUMS [M, E] int64
    zeros; LOGITS [M, E], IDS [M, TOP_K] int64, TOPW [M, TOP_K] fp32 (out); WG/WU [E, NI, N] the experts' gate and
    up, GU [M * TOP_K, 2 * NI] (out), WD [E, N, NI] their down; BAR int32 [4] zeros; SCRATCH fp32 [BLOCK_E]
    (`rank_logits`'s choosers, RANK_CHUNK > 0), RSTDS fp32 [M] (each row's 1/RMS, from the routing program).
    PHASE 0: all three phases in one launch; 1, 2, 3: that phase alone (three launches). TIMING: each program stores
    the GPU's clock at its start, the end of phase 1, once routed, at the end of phase 2, after the barrier and at
    its end into STAMPS [programs, 8] int64, to time the phases apart."""
    pid = tl.program_id(0)
    programs = tl.num_programs(0)
    _stamp(STAMPS, pid, 0, TIMING)
    if PDL:  # the grid is resident before the next kernel can launch: it launches once every program is running
        tl.extra.cuda.gdc_launch_dependents()
    if PHASE <= 1:
        _o_phase(pid, programs, X, WO, R, H, WS, TICKETS, RW, NW, SUMS, M, N, K, E, scale, x_s0, wo_s0, r_s0, h_s0,
                 BLOCK_E, BLOCK_M, BLOCK_N1, BLOCK_K1, SPLIT_K1, PDL)
    elif PDL:
        tl.extra.cuda.gdc_wait()
    _stamp(STAMPS, pid, 1, TIMING)
    if PHASE == 0 or PHASE == 2:
        if PHASE == 0:
            tl.debug_barrier()  # every thread's stores of phase 1 issued before the arrival
            if tl.atomic_add(BAR, 1, sem="acq_rel") == programs - 1:  # the last to arrive: every strip of H is in
                _route(H, SUMS, LOGITS, RB, IDS, TOPW, RSTDS, SCRATCH, M, N, E, eps, inv_scale, h_s0, TOP_K, SOFTMAX,
                       RENORM, HAS_BIAS, BLOCK_E, BLOCK_M, RSTD_BLOCK, RANK_CHUNK)
                tl.debug_barrier()
                tl.atomic_xchg(BAR + 3, 1, sem="release")
            else:
                _wait(BAR + 3, 1, BAR + 2, SPINS)
        elif pid == 0:  # the interpreter: program 0 runs before the others
            _route(H, SUMS, LOGITS, RB, IDS, TOPW, RSTDS, SCRATCH, M, N, E, eps, inv_scale, h_s0, TOP_K, SOFTMAX,
                   RENORM, HAS_BIAS, BLOCK_E, BLOCK_M, RSTD_BLOCK, RANK_CHUNK)
        _stamp(STAMPS, pid, 2, TIMING)
        pairs = tl.arange(0, BLOCK_P)
        experts = tl.load(IDS + pairs, mask=pairs < M * TOP_K, other=0, cache_modifier=".cg")
        rstd = tl.load(RSTDS + tl.arange(0, BLOCK_M), mask=tl.arange(0, BLOCK_M) < M, other=0.0,
                       cache_modifier=".cg")
        _gate_up_phase(pid, programs, experts, rstd, H, NW, WG, WU, GU, M, N, NI, h_s0, wg_se, wg_sn, wu_se, wu_sn,
                       gu_s0, TOP_K, BLOCK_M, BLOCK_P, BLOCK_N2, BLOCK_K2)
    _stamp(STAMPS, pid, 3, TIMING)
    if PHASE == 3:
        pairs = tl.arange(0, BLOCK_P)
        experts = tl.load(IDS + pairs, mask=pairs < M * TOP_K, other=0, cache_modifier=".cg")
    if PHASE == 0 or PHASE == 3:
        # Its first weight tile needs only the ids: in flight before the barrier.
        w_first = _down_load(0, _down_total(pid, programs, M, N, NI, TOP_K, BLOCK_N3, BLOCK_K3), pid, programs,
                             tl.cdiv(NI, BLOCK_K3), tl.cdiv(N, BLOCK_N3), experts, WD, N, NI, wd_se, wd_sn, TOP_K,
                             BLOCK_P, BLOCK_N3, BLOCK_K3)
        if PHASE == 0:
            _grid_barrier(BAR, 2 * programs, BAR + 2, SPINS)  # phase 1's arrivals and these
        _stamp(STAMPS, pid, 4, TIMING)
        _down_phase(pid, programs, experts, w_first, TOPW, GU, WD, H, OUT, M, N, NI, gu_s0, wd_se, wd_sn, h_s0,
                    out_s0, TOP_K, BLOCK_P, BLOCK_N3, BLOCK_K3)
    _stamp(STAMPS, pid, 5, TIMING)
    if PHASE == 0:  # noqa: SIM102 (Triton evaluates both sides of an `and`)
        if last_of_group(BAR + 1, programs):  # every program is past every wait: reset for the next launch
            tl.atomic_xchg(BAR, 0)
            tl.atomic_xchg(BAR + 3, 0)
            tl.atomic_xchg(BAR + 1, 0)


@triton.jit
def _route(H, SUMS, LOGITS, RB, IDS, TOPW, RSTDS, SCRATCH, M, N, E, eps, inv_scale, h_s0,
           TOP_K: tl.constexpr, SOFTMAX: tl.constexpr, RENORM: tl.constexpr, HAS_BIAS: tl.constexpr,
           BLOCK_E: tl.constexpr, BLOCK_M: tl.constexpr, RSTD_BLOCK: tl.constexpr, RANK_CHUNK: tl.constexpr):
    """`route_sums_row` for the M rows, their 1/RMS into RSTDS (for phase 2's norm)."""
    for m in tl.static_range(BLOCK_M):
        if m < M:
            route_sums_row(SUMS + m * E, H + m * h_s0, LOGITS + m * E, RB, IDS + m * TOP_K, TOPW + m * TOP_K,
                           RSTDS + m, SCRATCH, E, N, eps, inv_scale, TOP_K, SOFTMAX, RENORM, HAS_BIAS, BLOCK_E,
                           RSTD_BLOCK, RANK_CHUNK, True)


@triton.jit
def _o_phase(pid, programs, X, WO, R, H, WS, TICKETS, RW, NW, SUMS, M, N, K, E, scale, x_s0, wo_s0, r_s0, h_s0,
             BLOCK_E: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
             SPLIT_K: tl.constexpr, PDL: tl.constexpr):
    """Phase 1: units (strip, split) of H = R + X @ WO.T, every programs-th from pid, their tiles in one loop, the
    next tile's load issued before this one's sums (the first before the PDL wait); each finished strip's share of
    the router's sums."""
    strips = tl.cdiv(N, BLOCK_N)
    units = strips * SPLIT_K
    tiles = tl.cdiv(tl.cdiv(K, SPLIT_K), BLOCK_K)
    total = tl.where(pid < units, tl.cdiv(units - pid, programs), 0) * tiles
    w_next = _o_load(0, total, pid, programs, tiles, WO, N, K, wo_s0, BLOCK_N, BLOCK_K, SPLIT_K)
    if PDL:
        tl.extra.cuda.gdc_wait()
    rm = tl.arange(0, BLOCK_M)
    rstd = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for it in range(0, total):
        pid_n, pid_k, kt, ks, k_hi = _o_at(it, pid, programs, tiles, K, BLOCK_K, SPLIT_K)
        w = w_next
        w_next = _o_load(it + 1, total, pid, programs, tiles, WO, N, K, wo_s0, BLOCK_N, BLOCK_K, SPLIT_K)
        acc = tile_sums(tl.where(kt == 0, 0.0, acc), w, ks, k_hi, X, X, WO, M, x_s0, 0, rstd, rm, False, False, BLOCK_M)
        if kt == tiles - 1:  # Triton evaluates both sides of an `and`: strip_end only at a unit's end
            done, _ = strip_end(acc, pid_n, pid_k, strips, WO, R, H, WS, TICKETS, M, N, r_s0, h_s0, False, True,
                                BLOCK_M, BLOCK_N, SPLIT_K)
            if done:
                rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
                rw = router_strip(RW, NW, rn, rn < N, N, E, BLOCK_E)
                add_router_share(rw, H, SUMS, rn, rn < N, M, E, scale, h_s0, BLOCK_E, BLOCK_M)


@triton.jit
def _o_at(it, pid, programs, tiles, K, BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr):
    """(strip, split, tile in the split, its K columns, the split's end) of tile `it` of this program's phase 1."""
    j = it // tiles
    kt = it - j * tiles
    unit = pid + j * programs
    pid_n = unit // SPLIT_K
    pid_k = unit - pid_n * SPLIT_K
    k_lo, k_hi = k_range(pid_k, K, BLOCK_K, SPLIT_K)
    return pid_n, pid_k, kt, k_lo + kt * BLOCK_K + tl.arange(0, BLOCK_K), k_hi


@triton.jit
def _o_load(it, total, pid, programs, tiles, WO, N, K, wo_s0, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
            SPLIT_K: tl.constexpr):
    """WO's tile `it` of this program's phase 1 (zeros from `total` on)."""
    pid_n, _, _, ks, k_hi = _o_at(it, pid, programs, tiles, K, BLOCK_K, SPLIT_K)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    live = (ks < k_hi) & (ks * 0 + it < total)  # a block compare: a scalar mask is no mask to every interpreter
    return tl.load(WO + rn[:, None].to(tl.int64) * wo_s0 + ks[None, :], mask=(rn < N)[:, None] & live[None, :],
                   other=0.0)


@triton.jit
def _gate_up_phase(pid, programs, experts, rstd, H, NW, WG, WU, GU, M, N, NI, h_s0, wg_se, wg_sn, wu_se, wu_sn, gu_s0,
                   TOP_K: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr,
                   BLOCK_K: tl.constexpr):
    """Phase 2's GEMV: units (pair, strip of the gate rows then of the up rows) of GU[pair] = [gate | up] @
    rms_norm(H[token]), the pair's expert from `experts`, every programs-th unit from pid, their tiles in one loop,
    the next tile's weights and input chunk loaded before this one is summed."""
    half = tl.cdiv(NI, BLOCK_N)
    units = M * TOP_K * 2 * half
    tiles = tl.cdiv(N, BLOCK_K)
    total = tl.where(pid < units, tl.cdiv(units - pid, programs), 0) * tiles
    rm = tl.arange(0, BLOCK_M)
    acc = tl.zeros([1, BLOCK_N], tl.float32)
    w_next, x_next, nw_next = _gate_up_load(0, total, pid, programs, tiles, half, experts, H, NW, WG, WU, N, NI, h_s0,
                                            wg_se, wg_sn, wu_se, wu_sn, TOP_K, BLOCK_P, BLOCK_N, BLOCK_K)
    for it in range(0, total):
        pair, kt, _, col, n_mask, second = _gate_up_at(it, pid, programs, tiles, half, NI, BLOCK_N, BLOCK_K)
        w, x, nw = w_next, x_next, nw_next
        w_next, x_next, nw_next = _gate_up_load(it + 1, total, pid, programs, tiles, half, experts, H, NW, WG, WU, N,
                                                NI, h_s0, wg_se, wg_sn, wu_se, wu_sn, TOP_K, BLOCK_P, BLOCK_N, BLOCK_K)
        r = tl.sum(tl.where(rm == pair // TOP_K, rstd, 0.0), axis=0)
        x = row_input(x, x, nw.to(tl.float32), r, H.dtype.element_ty, True, False)
        acc = tl.where(kt == 0, 0.0, acc) + tl.sum(w.to(tl.float32) * x.to(tl.float32)[None, :], axis=1)[None, :]
        last = n_mask & ((col * 0 + kt) == tiles - 1)  # a block compare: a scalar mask is no mask to every interpreter
        tl.store(GU + pair * gu_s0 + (col + NI * second.to(tl.int32))[None, :], acc.to(GU.dtype.element_ty),
                 mask=last[None, :])


@triton.jit
def _gate_up_at(it, pid, programs, tiles, half, NI, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """(pair, tile, its K columns, the strip's columns, their mask, whether up's) of tile `it` of phase 2."""
    j = it // tiles
    kt = it - j * tiles
    unit = pid + j * programs
    pair = unit // (2 * half)
    strip = unit - pair * 2 * half
    second = strip >= half
    col = (strip - half * second.to(tl.int32)) * BLOCK_N + tl.arange(0, BLOCK_N)
    return pair, kt, kt * BLOCK_K + tl.arange(0, BLOCK_K), col, col < NI, second


@triton.jit
def _gate_up_load(it, total, pid, programs, tiles, half, experts, H, NW, WG, WU, N, NI, h_s0, wg_se, wg_sn, wu_se,
                  wu_sn, TOP_K: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """(the gate or up tile, the residual row's chunk, the norm weight's chunk) of tile `it` of this program's
    phase 2, of its pair's expert and token (zeros from `total` on)."""
    pair, _, ks, col, n_mask, second = _gate_up_at(it, pid, programs, tiles, half, NI, BLOCK_N, BLOCK_K)
    expert = tl.sum(tl.where(tl.arange(0, BLOCK_P) == pair, experts, 0), axis=0)
    rows = expert_rows(second, WU, wu_se, wu_sn, WG, wg_se, wg_sn, expert, col)
    live = (ks < N) & (ks * 0 + it < total)
    w = tl.load(rows + ks[None, :], mask=n_mask[:, None] & live[None, :], other=0.0)
    x = tl.load(H + (pair // TOP_K) * h_s0 + ks, mask=live, other=0.0)
    return w, x, tl.load(NW + ks, mask=live, other=0.0)


@triton.jit
def _down_total(pid, programs, M, N, NI, TOP_K: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """The tiles of this program's phase 3: its units (token, strip) times TOP_K experts times their K tiles."""
    units = M * tl.cdiv(N, BLOCK_N)
    return tl.where(pid < units, tl.cdiv(units - pid, programs), 0) * TOP_K * tl.cdiv(NI, BLOCK_K)


@triton.jit
def _down_phase(pid, programs, experts, w_first, TOPW, GU, WD, H, OUT, M, N, NI, gu_s0, wd_se, wd_sn, h_s0, out_s0,
                TOP_K: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """Phase 3: units (token, strip) of OUT = H + sum over the token's experts j of TOPW[j] * (silu(gate) * up of
    GU's row) @ WD[experts[j]].T, every programs-th unit from pid; a unit's TOP_K experts and their tiles, and the
    next unit's, in one loop, the next tile's weights and input chunks loaded before this one is summed (the first
    tile, w_first, by the caller)."""
    strips = tl.cdiv(N, BLOCK_N)
    tiles = tl.cdiv(NI, BLOCK_K)
    total = _down_total(pid, programs, M, N, NI, TOP_K, BLOCK_N, BLOCK_K)
    pairs = tl.arange(0, BLOCK_P)
    routing_w = tl.load(TOPW + pairs, mask=pairs < M * TOP_K, other=0.0, cache_modifier=".cg")
    acc = tl.zeros([1, BLOCK_N], tl.float32)
    total_w = tl.zeros([1, BLOCK_N], tl.float32)
    w_next = w_first
    g_next, u_next = _down_input(0, total, pid, programs, tiles, strips, GU, NI, gu_s0, TOP_K, BLOCK_N, BLOCK_K)
    for it in range(0, total):
        token, choice, kt, _, col = _down_at(it, pid, programs, tiles, strips, TOP_K, BLOCK_N, BLOCK_K)
        w, g, u = w_next, g_next, u_next
        w_next = _down_load(it + 1, total, pid, programs, tiles, strips, experts, WD, N, NI, wd_se, wd_sn, TOP_K,
                            BLOCK_P, BLOCK_N, BLOCK_K)
        g_next, u_next = _down_input(it + 1, total, pid, programs, tiles, strips, GU, NI, gu_s0, TOP_K, BLOCK_N,
                                     BLOCK_K)
        pair = token * TOP_K + choice
        x = row_input(g, u, 0.0, 0.0, GU.dtype.element_ty, False, True)
        acc = tl.where(kt == 0, 0.0, acc) + tl.sum(w.to(tl.float32) * x.to(tl.float32)[None, :], axis=1)[None, :]
        # The pair's product done: weighted into the token's sum in fp32, in choice order (expert_gemv's split-K sum).
        weighted = (tl.where(choice == 0, 0.0, total_w)
                    + acc * tl.sum(tl.where(pairs == pair, routing_w, 0.0), axis=0))
        total_w = tl.where(kt == tiles - 1, weighted, total_w)
        last = (col < N) & ((col * 0 + choice * tiles + kt) == TOP_K * tiles - 1)  # a block compare (interpreters)
        residual = tl.load(H + token * h_s0 + col[None, :], mask=last[None, :], other=0.0)  # read at the last only
        out = total_w.to(OUT.dtype.element_ty).to(tl.float32) + residual.to(tl.float32)
        tl.store(OUT + token * out_s0 + col[None, :], out.to(OUT.dtype.element_ty), mask=last[None, :])


@triton.jit
def _down_at(it, pid, programs, tiles, strips, TOP_K: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """(token, choice, tile, its K columns, the strip's columns) of tile `it` of phase 3."""
    per_unit = TOP_K * tiles
    j = it // per_unit
    rest = it - j * per_unit
    choice = rest // tiles
    kt = rest - choice * tiles
    unit = pid + j * programs
    token = unit // strips
    col = (unit - token * strips) * BLOCK_N + tl.arange(0, BLOCK_N)
    return token, choice, kt, kt * BLOCK_K + tl.arange(0, BLOCK_K), col


@triton.jit
def _down_load(it, total, pid, programs, tiles, strips, experts, WD, N, NI, wd_se, wd_sn, TOP_K: tl.constexpr,
               BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """The down tile `it` of this program's phase 3, of its pair's expert (zeros from `total` on)."""
    token, choice, _, ks, col = _down_at(it, pid, programs, tiles, strips, TOP_K, BLOCK_N, BLOCK_K)
    expert = tl.sum(tl.where(tl.arange(0, BLOCK_P) == token * TOP_K + choice, experts, 0), axis=0)
    live = (ks < NI) & (ks * 0 + it < total)
    return tl.load(WD + expert * wd_se + col[:, None].to(tl.int64) * wd_sn + ks[None, :],
                   mask=(col < N)[:, None] & live[None, :], other=0.0)


@triton.jit
def _down_input(it, total, pid, programs, tiles, strips, GU, NI, gu_s0, TOP_K: tl.constexpr, BLOCK_N: tl.constexpr,
                BLOCK_K: tl.constexpr):
    """(gate, up) chunks of GU's row of tile `it`'s pair in this program's phase 3 (zeros from `total` on)."""
    token, choice, _, ks, _ = _down_at(it, pid, programs, tiles, strips, TOP_K, BLOCK_N, BLOCK_K)
    row = GU + (token * TOP_K + choice) * gu_s0 + ks
    live = (ks < NI) & (ks * 0 + it < total)
    return tl.load(row, mask=live, other=0.0), tl.load(row + NI, mask=live, other=0.0)


@triton.jit
def _pause():
    """About 100 ns of sleep between two polls of a count: hundreds of programs polling one address without pause
    queue in front of the arrivals they wait for. Returns 1."""
    return tl.inline_asm_elementwise("nanosleep.u32 100;\n mov.u32 $0, 1;", "=r,r", [tl.program_id(0)],
                                     dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def _wait(COUNT, target, GAVE_UP, SPINS: tl.constexpr):
    """Poll COUNT until it reaches target (then acquire: what was released before it is seen), or give up after
    SPINS polls and set GAVE_UP."""
    seen = tl.load(COUNT, volatile=True)
    spins = 0
    while (seen < target) & (spins < SPINS):
        spins += _pause()
        seen = tl.load(COUNT, volatile=True)
    if seen < target:
        tl.atomic_xchg(GAVE_UP, 1)
    tl.atomic_add(COUNT, 0, sem="acquire")


@triton.jit
def _grid_barrier(BAR, target, GAVE_UP, SPINS: tl.constexpr):
    """Arrive at the launch's barrier (BAR's count, acq_rel) and wait until it counts `target` arrivals (every
    program's, for as many barriers as the program has passed)."""
    tl.debug_barrier()  # every thread's stores issued before the arrival
    tl.atomic_add(BAR, 1, sem="acq_rel")
    _wait(BAR, target, GAVE_UP, SPINS)


@triton.jit
def _stamp(STAMPS, pid, slot, TIMING: tl.constexpr):
    """STAMPS[pid, slot] = the GPU's nanosecond clock (%globaltimer), under TIMING."""
    if TIMING:
        now = tl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l,r", [pid], dtype=tl.int64, is_pure=False,
                                        pack=1)
        tl.store(STAMPS + pid * 8 + slot, now)
