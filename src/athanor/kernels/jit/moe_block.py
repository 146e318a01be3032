"""A MoE block at batch 1 in one persistent launch: the O projection, the router, routing and the routed experts.

At batch 1 the block was four launches a layer (the O projection summing the router's logits, the routing kernel,
the experts' gate/up GEMV, their down GEMV), and on qwen3-30b-a3b on an H200 they took 37 us a layer for 22 us of
weight bytes: each boundary costs a ramp (a kernel's programs start cold, its first loads wait on the wait for the
one before) and a tail (the last programs of a wave run alone). Here one grid of a few programs per SM, all resident
at once, walks the three GEMVs in turn, each program taking every P-th unit of work, with a grid-wide barrier between
them (an atomic count, spun on from L2): what the kernel boundary did, without its ramp and tail.

- Phase 1: the O projection, h = R + X @ WO.T, strip by strip (split-K as `strip_from`), each strip's share of the
  router's logits added into int64 fixed-point sums (`add_router_share`, as `fused_gemv_router_kernel`).
- Barrier. Phase 2: every program reads the sums and the row's RMS and ranks the experts itself (`rank_logits`: all
  get the same ids, in registers), program 0 stores the logits, ids and weights; then the chosen experts' gate and up
  rows, RMS-normed input, as `expert_gemv_kernel` (SHARED, NORM) computes them, into GU [pairs, 2 * NI].
- Barrier. Phase 3: the down projection: a strip of the output sums its token's experts itself (SiLU-mul of GU's
  halves, scaled by the routing weight, in fp32 in the order of `expert_gemv_kernel`'s split-K sum), plus the
  residual h: no workspace, no ticket.
The last program out zeroes the sums and the barrier's counters for the next launch (CUDA-graph replays included).

Phases 2 and 3 run a unit's K tiles and the next unit's in one loop, so the pipeline of weight loads runs on across
units instead of draining at each. Every result matches the four-launch path bit for bit for the same blocks (the
same operations in the same order: a unit test on the CPU interpreter).

The barrier needs every program resident at once; `athanor.kernels.moe_block` sizes the grid from the compiled
kernel's registers and shared memory, and a program that spins SPINS times without the others arriving gives up and
raises the flag at BAR[2] (wrong results, a failed test, instead of a hung GPU). The interpreter runs programs one
after another, so there (PHASE 1, 2, 3) each phase is a launch of its own, and phase 3 reads the ids back.
"""

from __future__ import annotations

import triton
import triton.language as tl

from athanor.kernels.jit.fused_gemv import _rstd, _tile, add_router_share, k_range, router_strip, strip_end
from athanor.kernels.jit.moe import rank_logits
from athanor.kernels.jit.tickets import last_of_group


@triton.jit
def moe_block_kernel(
    X, WO, R, H, WS, TICKETS, RW, NW, SUMS, LOGITS, RB, IDS, TOPW, WG, WU, GU, WD, OUT, BAR, STAMPS, SCRATCH,
    M, N, K, E, NI, eps, scale, inv_scale,
    x_s0, wo_s0, r_s0, h_s0, wg_se, wg_sn, wu_se, wu_sn, gu_s0, wd_se, wd_sn, out_s0,
    TOP_K: tl.constexpr, SOFTMAX: tl.constexpr, RENORM: tl.constexpr, HAS_BIAS: tl.constexpr, BLOCK_E: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_P: tl.constexpr,
    BLOCK_N1: tl.constexpr, BLOCK_K1: tl.constexpr, SPLIT_K1: tl.constexpr,
    BLOCK_N2: tl.constexpr, BLOCK_K2: tl.constexpr, BLOCK_N3: tl.constexpr, BLOCK_K3: tl.constexpr,
    RANK_CHUNK: tl.constexpr, AHEAD: tl.constexpr, PHASE: tl.constexpr, PDL: tl.constexpr, RSTD_BLOCK: tl.constexpr,
    SPINS: tl.constexpr, TIMING: tl.constexpr,
):
    """OUT = H + the routed experts of rms_norm(H), H = R + X @ WO.T, for M <= BLOCK_M rows (see the module).

    X [M, K], WO [N, K], R/H/OUT [M, N]; RW [E, N] the router, NW [N] the block's RMSNorm weight, SUMS [M, E] int64
    zeros; LOGITS [M, E], IDS [M, TOP_K] int64, TOPW [M, TOP_K] fp32 (out); WG/WU [E, NI, N] the experts' gate and
    up, GU [M * TOP_K, 2 * NI] (out), WD [E, N, NI] their down; BAR int32 [3] zeros; SCRATCH fp32 [programs, BLOCK_E]
    (`rank_logits`'s choosers when RANK_CHUNK > 0). AHEAD (1 or 2): weight tiles in flight while one is summed.
    PHASE 0: all three phases with grid barriers between; 1, 2, 3: that phase alone (three launches). TIMING: each
    program stores the GPU's clock at its start, the end of phase 1, after the barrier, after the routing, at the end
    of phase 2, after the barrier and at its end into STAMPS [programs, 8] int64 (`bench/moe_block_phases.py`)."""
    pid = tl.program_id(0)
    programs = tl.num_programs(0)
    _stamp(STAMPS, pid, 0, TIMING)
    if PDL:  # the grid is resident before the next kernel can launch: it launches once every program is running
        tl.extra.cuda.gdc_launch_dependents()
    if PHASE <= 1:
        _o_phase(pid, programs, X, WO, R, H, WS, TICKETS, RW, NW, SUMS, M, N, K, E, scale, x_s0, wo_s0, r_s0, h_s0,
                 BLOCK_E, BLOCK_M, BLOCK_N1, BLOCK_K1, SPLIT_K1, AHEAD, PDL)
    elif PDL:
        tl.extra.cuda.gdc_wait()
    _stamp(STAMPS, pid, 1, TIMING)
    if PHASE == 0:
        _grid_barrier(BAR, programs, SPINS)
    _stamp(STAMPS, pid, 2, TIMING)
    if PHASE == 0 or PHASE == 2:
        rm = tl.arange(0, BLOCK_M)
        rstd = tl.zeros([BLOCK_M], tl.float32)
        pair = tl.arange(0, BLOCK_P)
        experts = tl.zeros([BLOCK_P], tl.int64)
        e = tl.arange(0, BLOCK_E)
        e_mask = e < E
        for m in tl.static_range(BLOCK_M):
            if m < M:
                r = _rstd(H + m * h_s0, N, eps, M - m, BLOCK_K2, RSTD_BLOCK)
                rstd = tl.where(rm == m, r, rstd)
                sums = tl.load(SUMS + m * E + e, mask=e_mask, other=0, cache_modifier=".cg")
                logits = (sums.to(tl.float32) * inv_scale * r).to(LOGITS.dtype.element_ty)
                rank, chosen, weights = rank_logits(tl.where(e_mask, logits.to(tl.float32), float("-inf")), RB, e, E,
                                                    TOP_K, SOFTMAX, RENORM, HAS_BIAS, SCRATCH + pid * BLOCK_E,
                                                    RANK_CHUNK)
                hit = ((m * TOP_K + rank)[None, :] == pair[:, None]) & chosen[None, :]
                experts += tl.sum(tl.where(hit, e[None, :], 0), axis=1)
                if pid == 0:
                    tl.store(LOGITS + m * E + e, logits, mask=e_mask)
                    tl.store(IDS + m * TOP_K + rank, e.to(tl.int64), mask=chosen)
                    tl.store(TOPW + m * TOP_K + rank, weights, mask=chosen)
        if PHASE == 2:
            _release(SUMS, BAR, M, E, programs, BLOCK_M, BLOCK_E, False)
        _stamp(STAMPS, pid, 3, TIMING)
        _gate_up_phase(pid, programs, experts, rstd, H, NW, WG, WU, GU, M, N, NI, h_s0, wg_se, wg_sn, wu_se, wu_sn,
                       gu_s0, TOP_K, BLOCK_M, BLOCK_P, BLOCK_N2, BLOCK_K2, AHEAD)
    _stamp(STAMPS, pid, 4, TIMING)
    if PHASE == 0:
        _grid_barrier(BAR, 2 * programs, SPINS)
    _stamp(STAMPS, pid, 5, TIMING)
    if PHASE == 0 or PHASE == 3:
        _down_phase(pid, programs, IDS, TOPW, GU, WD, H, OUT, M, N, NI, gu_s0, wd_se, wd_sn, h_s0, out_s0,
                    TOP_K, BLOCK_P, BLOCK_N3, BLOCK_K3, AHEAD)
    _stamp(STAMPS, pid, 6, TIMING)
    if PHASE == 0:
        _release(SUMS, BAR, M, E, programs, BLOCK_M, BLOCK_E, True)


@triton.jit
def _stamp(STAMPS, pid, slot, TIMING: tl.constexpr):
    """STAMPS[pid, slot] = the GPU's nanosecond clock (%globaltimer), under TIMING."""
    if TIMING:
        now = tl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l,r", [pid], dtype=tl.int64, is_pure=False,
                                        pack=1)
        tl.store(STAMPS + pid * 8 + slot, now)


@triton.jit
def _o_phase(pid, programs, X, WO, R, H, WS, TICKETS, RW, NW, SUMS, M, N, K, E, scale, x_s0, wo_s0, r_s0, h_s0,
             BLOCK_E: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
             SPLIT_K: tl.constexpr, AHEAD: tl.constexpr, PDL: tl.constexpr):
    """Phase 1: units (strip, split) of H = R + X @ WO.T, every programs-th from pid, their tiles in one loop, the
    next tile's load issued before this one's sums (the first before the PDL wait); each finished strip's share of
    the router's sums."""
    strips = tl.cdiv(N, BLOCK_N)
    units = strips * SPLIT_K
    tiles = tl.cdiv(tl.cdiv(K, SPLIT_K), BLOCK_K)
    total = tl.where(pid < units, tl.cdiv(units - pid, programs), 0) * tiles
    w_next = _o_load(0, total, pid, programs, tiles, WO, N, K, wo_s0, BLOCK_N, BLOCK_K, SPLIT_K)
    w_after = _o_load(AHEAD - 1, total, pid, programs, tiles, WO, N, K, wo_s0, BLOCK_N, BLOCK_K, SPLIT_K)
    if PDL:
        tl.extra.cuda.gdc_wait()
    rm = tl.arange(0, BLOCK_M)
    rstd = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for it in range(0, total):
        pid_n, pid_k, kt, ks, k_hi = _o_at(it, pid, programs, tiles, K, BLOCK_K, SPLIT_K)
        w = w_next
        if AHEAD == 2:  # two tiles in flight: the one after next issued now
            w_next = w_after
            w_after = _o_load(it + 2, total, pid, programs, tiles, WO, N, K, wo_s0, BLOCK_N, BLOCK_K, SPLIT_K)
        else:
            w_next = _o_load(it + 1, total, pid, programs, tiles, WO, N, K, wo_s0, BLOCK_N, BLOCK_K, SPLIT_K)
        acc = _tile(tl.where(kt == 0, 0.0, acc), w, ks, k_hi, X, X, WO, M, x_s0, 0, rstd, rm, False, False, BLOCK_M)
        if kt == tiles - 1:  # noqa: SIM102 (Triton evaluates both sides of an `and`: strip_end only at a unit's end)
            if strip_end(acc, pid_n, pid_k, strips, WO, R, H, WS, TICKETS, M, N, r_s0, h_s0, False, True, BLOCK_M,
                         BLOCK_N, SPLIT_K):
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
                   BLOCK_K: tl.constexpr, AHEAD: tl.constexpr):
    """Phase 2's GEMV: units (pair, strip of the gate rows then of the up rows) of GU[pair] = [gate | up] @
    rms_norm(H[token]), the pair's expert from `experts` (registers), every programs-th unit from pid, their tiles
    in one loop, the next tile's load issued before this one's sums."""
    half = tl.cdiv(NI, BLOCK_N)
    units = M * TOP_K * 2 * half
    tiles = tl.cdiv(N, BLOCK_K)
    total = tl.where(pid < units, tl.cdiv(units - pid, programs), 0) * tiles
    rm = tl.arange(0, BLOCK_M)
    one = tl.arange(0, 1)
    acc = tl.zeros([1, BLOCK_N], tl.float32)
    w_next = _gate_up_load(0, total, pid, programs, tiles, half, experts, WG, WU, N, NI, wg_se, wg_sn, wu_se, wu_sn,
                           BLOCK_P, BLOCK_N, BLOCK_K)
    w_after = _gate_up_load(AHEAD - 1, total, pid, programs, tiles, half, experts, WG, WU, N, NI, wg_se, wg_sn, wu_se,
                            wu_sn, BLOCK_P, BLOCK_N, BLOCK_K)
    for it in range(0, total):
        pair, kt, ks, col, n_mask, second = _gate_up_at(it, pid, programs, tiles, half, NI, BLOCK_N, BLOCK_K)
        w = w_next
        if AHEAD == 2:  # two tiles in flight: the one after next issued now
            w_next = w_after
            w_after = _gate_up_load(it + 2, total, pid, programs, tiles, half, experts, WG, WU, N, NI, wg_se, wg_sn,
                                    wu_se, wu_sn, BLOCK_P, BLOCK_N, BLOCK_K)
        else:
            w_next = _gate_up_load(it + 1, total, pid, programs, tiles, half, experts, WG, WU, N, NI, wg_se, wg_sn,
                                   wu_se, wu_sn, BLOCK_P, BLOCK_N, BLOCK_K)
        token = pair // TOP_K
        r = tl.zeros([1], tl.float32) + tl.sum(tl.where(rm == token, rstd, 0.0), axis=0)
        acc = _tile(tl.where(kt == 0, 0.0, acc), w, ks, N, H + token * h_s0, H, NW, 1, 0, 0, r, one, True, False, 1)
        last = n_mask & ((col * 0 + kt) == tiles - 1)
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
def _gate_up_load(it, total, pid, programs, tiles, half, experts, WG, WU, N, NI, wg_se, wg_sn, wu_se, wu_sn,
                  BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """The gate or up tile `it` of this program's phase 2, of its pair's expert (zeros from `total` on)."""
    pair, _, ks, col, n_mask, second = _gate_up_at(it, pid, programs, tiles, half, NI, BLOCK_N, BLOCK_K)
    expert = tl.sum(tl.where(tl.arange(0, BLOCK_P) == pair, experts, 0), axis=0)
    rows = tl.where(second, WU + expert * wu_se + col[:, None].to(tl.int64) * wu_sn,
                    WG + expert * wg_se + col[:, None].to(tl.int64) * wg_sn)
    live = (ks < N) & (ks * 0 + it < total)
    return tl.load(rows + ks[None, :], mask=n_mask[:, None] & live[None, :], other=0.0)


@triton.jit
def _down_phase(pid, programs, IDS, TOPW, GU, WD, H, OUT, M, N, NI, gu_s0, wd_se, wd_sn, h_s0, out_s0,
                TOP_K: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                AHEAD: tl.constexpr):
    """Phase 3: units (token, strip) of OUT = H + sum over the token's experts j of TOPW[j] * (silu(gate) * up of
    GU's row) @ WD[IDS[j]].T, every programs-th unit from pid; a unit's TOP_K experts and their tiles, and the next
    unit's, in one loop, the next tile's load issued before this one's sums. The ids and weights are read back from
    L2 (stored by program 0 in phase 2)."""
    strips = tl.cdiv(N, BLOCK_N)
    units = M * strips
    tiles = tl.cdiv(NI, BLOCK_K)
    total = tl.where(pid < units, tl.cdiv(units - pid, programs), 0) * TOP_K * tiles
    pairs = tl.arange(0, BLOCK_P)
    pair_mask = pairs < M * TOP_K
    experts = tl.load(IDS + pairs, mask=pair_mask, other=0, cache_modifier=".cg")
    routing_w = tl.load(TOPW + pairs, mask=pair_mask, other=0.0, cache_modifier=".cg")
    one = tl.arange(0, 1)
    acc = tl.zeros([1, BLOCK_N], tl.float32)
    total_w = tl.zeros([1, BLOCK_N], tl.float32)
    w_next = _down_load(0, total, pid, programs, tiles, strips, experts, WD, N, NI, wd_se, wd_sn, TOP_K, BLOCK_P,
                        BLOCK_N, BLOCK_K)
    w_after = _down_load(AHEAD - 1, total, pid, programs, tiles, strips, experts, WD, N, NI, wd_se, wd_sn, TOP_K,
                         BLOCK_P, BLOCK_N, BLOCK_K)
    for it in range(0, total):
        token, choice, kt, ks, col = _down_at(it, pid, programs, tiles, strips, TOP_K, BLOCK_N, BLOCK_K)
        w = w_next
        if AHEAD == 2:  # two tiles in flight: the one after next issued now
            w_next = w_after
            w_after = _down_load(it + 2, total, pid, programs, tiles, strips, experts, WD, N, NI, wd_se, wd_sn,
                                 TOP_K, BLOCK_P, BLOCK_N, BLOCK_K)
        else:
            w_next = _down_load(it + 1, total, pid, programs, tiles, strips, experts, WD, N, NI, wd_se, wd_sn, TOP_K,
                                BLOCK_P, BLOCK_N, BLOCK_K)
        pair = token * TOP_K + choice
        acc = _tile(tl.where(kt == 0, 0.0, acc), w, ks, NI, GU + pair * gu_s0, GU + pair * gu_s0 + NI, GU, 1, 0, 0,
                    tl.zeros([1], tl.float32), one, False, True, 1)
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
def _grid_barrier(BAR, target, SPINS: tl.constexpr):
    """Arrive at the launch's barrier and wait until BAR[0] counts `target` arrivals (every program's, for as many
    barriers as the program has passed). Stores before it are seen by every program after it (acq_rel arrival, an
    acquire after the wait). After SPINS reads without the count reached it gives up and sets BAR[2]."""
    tl.debug_barrier()  # every thread's stores issued before the arrival
    seen = tl.atomic_add(BAR, 1, sem="acq_rel") + 1
    spins = 0
    while (seen < target) & (spins < SPINS):
        seen = tl.load(BAR, volatile=True)
        spins += 1
    if seen < target:
        tl.atomic_xchg(BAR + 2, 1)
    tl.atomic_add(BAR, 0, sem="acquire")


@triton.jit
def _release(SUMS, BAR, M, E, programs, BLOCK_M: tl.constexpr, BLOCK_E: tl.constexpr, RESET: tl.constexpr):
    """The last program to get here (every one has read the sums) zeroes them, and with RESET the barrier's count."""
    if last_of_group(BAR + 1, programs):
        e = tl.arange(0, BLOCK_E)
        for m in tl.static_range(BLOCK_M):
            if m < M:
                tl.store(SUMS + m * E + e, tl.zeros([BLOCK_E], tl.int64), mask=e < E)
        if RESET:
            tl.atomic_xchg(BAR, 0)
        tl.atomic_xchg(BAR + 1, 0)
