"""RMSNorm, optionally fused with the residual add that precedes it, one program per row."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def rms_norm_kernel(
    X, R, W, Y, R_OUT,
    x_stride, r_stride, y_stride,
    H, eps,
    HAS_RESIDUAL: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr,
):
    if PDL:  # programmatic dependent launch: wait for the kernel that wrote x
        tl.extra.cuda.gdc_wait()
    row = tl.program_id(0).to(tl.int64)  # rows x stride may pass 2^31
    cols = tl.arange(0, BLOCK)
    mask = cols < H
    x = tl.load(X + row * x_stride + cols, mask=mask, other=0.0)
    if HAS_RESIDUAL:
        # The sum is rounded to the model dtype first, exactly as `x = x + f(x)` does in the reference.
        x = x + tl.load(R + row * r_stride + cols, mask=mask, other=0.0)
        tl.store(R_OUT + row * y_stride + cols, x, mask=mask)
    xf = x.to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(xf * xf, axis=0) / H + eps)
    normed = (xf * rstd).to(x.dtype)  # cast before the scale, as HF's LlamaRMSNorm does
    w = tl.load(W + cols, mask=mask, other=0.0)
    tl.store(Y + row * y_stride + cols, (w.to(tl.float32) * normed.to(tl.float32)).to(x.dtype), mask=mask)
