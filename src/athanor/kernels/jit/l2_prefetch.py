"""Warming L2 with a later kernel's weights while the HBM would otherwise sit idle.

At decode batch 1 a layer's attention reads a few MB of keys and values, then the O projection streams its weight
(16.8 MB for qwen3-30b-a3b) and every program of it starts cold: its first loads wait on DRAM. The attention's
programs know that weight's address long before; each asks L2 for a share of it (`cp.async.bulk.prefetch.L2`,
Hopper's bulk prefetch: one instruction per contiguous range, nothing waited on, no register written), so the
bytes arrive while attention and its merge run and the projection reads them from L2. A hint: it changes no
value anywhere, only where the next loads find their bytes.
"""

from __future__ import annotations

import triton
import triton.language as tl

CHUNKS = tl.constexpr(256)
"""Bulk prefetches per program: with 4 warps, two a thread."""


LINES = tl.constexpr(1024)
"""Cache lines (128 bytes) a program asks for per instruction of each thread, in `prefetch_share(LINES=True)`."""


@triton.jit
def prefetch_share(BASE, nbytes, program, programs, CHUNKS: tl.constexpr, BY_LINE: tl.constexpr = False):
    """Ask L2 for this program's share (`program` of `programs`) of the `nbytes` bytes at BASE (16-byte aligned):
    CHUNKS bulk prefetches of whole 16-byte multiples, the last program's shorter, none past the end; or (BY_LINE)
    one `prefetch.global.L2` per 128-byte line, which no thread waits on."""
    if BY_LINE:
        lines = tl.cdiv(nbytes, 128)
        per_program = tl.cdiv(lines, programs)
        first = program.to(tl.int64) * per_program
        for l0 in range(0, per_program, LINES):
            line = first + l0 + tl.arange(0, LINES)
            ok = (line < lines) & (line < first + per_program)
            tl.inline_asm_elementwise(
                "{ .reg .pred p; setp.ne.s32 p, $2, 0; @p prefetch.global.L2 [$1]; mov.u32 $0, 0; }",
                "=r,l,r", [BASE.to(tl.pointer_type(tl.int8)) + line * 128, ok.to(tl.int32)], dtype=tl.int32,
                is_pure=False, pack=1)
        return
    per_program = tl.cdiv(tl.cdiv(nbytes, programs), CHUNKS * 16) * (CHUNKS * 16)
    chunk = per_program // CHUNKS
    starts = program.to(tl.int64) * per_program + tl.arange(0, CHUNKS).to(tl.int64) * chunk
    sizes = tl.minimum(tl.maximum(nbytes - starts, 0), chunk).to(tl.int32)
    tl.inline_asm_elementwise(
        "{ .reg .pred p; setp.ne.s32 p, $2, 0; @p cp.async.bulk.prefetch.L2.global [$1], $2; mov.u32 $0, 0; }",
        "=r,l,r", [BASE.to(tl.pointer_type(tl.int8)) + starts, sizes], dtype=tl.int32, is_pure=False, pack=1)
