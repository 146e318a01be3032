"""Asking L2 for a program's whole weight strip at once (Hopper's bulk prefetch, `cp.async.bulk.prefetch.L2`).

A GEMV program at decode streams its strip of rows a tile or two at a time: its own loads keep only those in flight,
so right after its wait the HBM ramps up behind a few requests a program. One bulk prefetch per contiguous range
asks for the whole strip at once (nothing waited on, no register written); the program's loads then find their
lines in L2 or already on the way. A hint: it changes no value, only where the loads find their bytes.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def prefetch_range(BASE, nbytes, CHUNKS: tl.constexpr):
    """Ask L2 for the `nbytes` bytes at BASE (16-byte aligned, nbytes a multiple of 16) in CHUNKS bulk prefetches,
    spread over the program's threads; none past the end, none of zero bytes."""
    chunk = tl.cdiv(tl.cdiv(nbytes, CHUNKS), 16) * 16
    starts = tl.arange(0, CHUNKS).to(tl.int64) * chunk
    sizes = tl.minimum(tl.maximum(nbytes - starts, 0), chunk).to(tl.int32)
    tl.inline_asm_elementwise(
        "{ .reg .pred p; setp.ne.s32 p, $2, 0; @p cp.async.bulk.prefetch.L2.global [$1], $2; mov.u32 $0, 0; }",
        "=r,l,r", [BASE.to(tl.pointer_type(tl.int8)) + starts, sizes], dtype=tl.int32, is_pure=False, pack=1)
