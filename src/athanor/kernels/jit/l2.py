"""Asking L2 for bytes a later kernel will read, without waiting for them (sm_90's bulk prefetch).

At batch 1 the HBM idles through a step's latency-bound stretches (a MoE layer's routing, the expert GEMVs' first
loads, which wait on it); a kernel running then can ask L2 for a weight the next kernels read, so that the weight
streams in that gap instead of on the path. `cp.async.bulk.prefetch.L2` names a byte range and returns at once: no
registers hold the bytes and nothing waits for them.
"""

from __future__ import annotations

import triton
import triton.language as tl

LANES: tl.constexpr = tl.constexpr(32)
"""Prefetches a program issues, one a lane of its first warp."""


@triton.jit
def prefetch_l2(BASE, nbytes):
    """Ask L2 for this program's share of the `nbytes` bytes at BASE (a 16-byte aligned tensor whose byte size is a
    multiple of 16), the grid's programs taking equal parts in their order: LANES bulk prefetches of equal
    16-byte-multiple chunks, issued by the first warp only (the other warps hold the same lanes: Triton replicates a
    32-element tensor across them)."""
    part = (tl.program_id(2) * tl.num_programs(1) + tl.program_id(1)) * tl.num_programs(0) + tl.program_id(0)
    parts = tl.num_programs(0) * tl.num_programs(1) * tl.num_programs(2)
    chunk = tl.cdiv(tl.cdiv(nbytes.to(tl.int64), parts * LANES), 16) * 16
    start = (part * LANES + tl.arange(0, LANES)).to(tl.int64) * chunk
    size = tl.minimum(chunk, tl.maximum(nbytes - start, 0)).to(tl.int32)
    tl.inline_asm_elementwise(
        """{
        .reg .pred p, q;
        .reg .u32 t;
        mov.u32 t, %tid.x;
        setp.gt.s32 p, $2, 0;
        setp.lt.u32 q, t, 32;
        and.pred p, p, q;
        @p cp.async.bulk.prefetch.L2.global [$1], $2;
        mov.u32 $0, 0;
        }""",
        "=r,l,r", [BASE.to(tl.pointer_type(tl.uint8)) + start, size], dtype=tl.int32, is_pure=False, pack=1)
