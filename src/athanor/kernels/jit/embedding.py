"""The decode step's first kernel: each row's embedding, gathered from the table."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def embedding_kernel(TOKENS, TABLE, OUT, H, t_s0, o_s0, BLOCK: tl.constexpr, PDL: tl.constexpr):
    """Grid (rows, cdiv(H, BLOCK)): OUT[row] = TABLE[TOKENS[row]]."""
    if PDL:
        # The next kernel (the first layer's QKV GEMV) may become resident now and issue its first weight loads
        # while this gather runs; its own wait still orders its reads of OUT after this kernel's writes.
        tl.extra.cuda.gdc_launch_dependents()
        tl.extra.cuda.gdc_wait()  # the tokens may be the previous kernel's output
    row = tl.program_id(0).to(tl.int64)
    token = tl.load(TOKENS + row).to(tl.int64)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < H
    tl.store(OUT + row * o_s0 + offs, tl.load(TABLE + token * t_s0 + offs, mask=mask), mask=mask)
