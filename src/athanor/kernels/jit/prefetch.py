"""Pulling a later kernel's weights into L2 while a latency-bound kernel leaves HBM idle.

At decode batch 1 the attention kernels read a few MB of KV cache with a few hundred programs: HBM sits
mostly idle for their microseconds, and the O projection after them then streams its weight cold. Each
attention program can instead ask L2 for a share of that weight first (Hopper's bulk L2 prefetch: one
instruction per thread, no registers or shared memory held, nothing waited on), so the projection finds
it in L2. A prefetch is a hint: it changes no value, only where the bytes come from.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def prefetch_l2(BASE, nbytes, chunk, program, programs, BLOCK: tl.constexpr):
    """Prefetch program `program`'s share (of `programs`) of the `nbytes` bytes at BASE (a uint8 pointer, 16-byte
    aligned) into L2: BLOCK chunks of `chunk` bytes (a multiple of 16; `programs * BLOCK * chunk >= nbytes`),
    one per thread at BLOCK = the program's thread count. Chunks past the end are clamped onto the last one
    (a repeated prefetch costs an instruction, not bytes)."""
    last = tl.cdiv(nbytes, chunk) - 1
    index = tl.minimum(program * BLOCK + tl.arange(0, BLOCK), last).to(tl.int64)
    offset = index * chunk
    size = tl.minimum(nbytes - offset, chunk).to(tl.int32)
    tl.inline_asm_elementwise("cp.async.bulk.prefetch.L2.global [$1], $2;\n\tmov.u32 $0, 0;", "=r,l,r",
                              [BASE + offset, size], dtype=tl.int32, is_pure=False, pack=1)
