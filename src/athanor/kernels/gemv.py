"""Linear layers for decode: cuBLAS, or a Triton split-K skinny GEMM for a handful of rows.

cuBLAS is strong at M >= 16 and at large N; at M = 1..8 on narrow projections its GEMV can leave
SMs idle, which split-K fixes. Whether it wins is a per-shape, per-device measurement: the
templates make it a choice (`gemv` option) rather than a rule.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from athanor.kernels.attention import _num_sms
from athanor.kernels.dispatch import PDL_EARLY, Impl, cdiv, interpreting, next_pow2, pdl, tickets, use_triton
from athanor.kernels.norm import rms_norm_torch

MAX_ROWS = 16
"""Largest row count the split-K path takes; above it `linear` uses cuBLAS."""
BLOCK_N, BLOCK_K = 64, 128


def splitk_linear(x: Tensor, w: Tensor, bias: Tensor | None = None, split_k: int | None = None,
                  impl: Impl = None) -> Tensor:
    """x @ w.T (+ bias). x: [M, K] with M <= 16; w: [N, K] row-major. Returns [M, N] in x's dtype."""
    if not use_triton(x, impl):
        return F.linear(x, w, bias)
    from athanor.kernels.jit.gemv import splitk_gemm_kernel

    m, k = x.shape
    n = w.shape[0]
    assert m <= MAX_ROWS and w.stride(1) == 1
    if x.stride(1) != 1:
        x = x.contiguous()
    strips = cdiv(n, BLOCK_N)
    if split_k is None:
        split_k = max(1, min(cdiv(2 * _num_sms(x.device), strips), k // (4 * BLOCK_K)))
    k_per_split = cdiv(cdiv(k, split_k), BLOCK_K) * BLOCK_K
    split_k = cdiv(k, k_per_split)
    if split_k == 1:
        out = torch.empty((m, n), dtype=x.dtype, device=x.device)
        o_s0, o_s1 = 0, out.stride(0)
    else:
        out = torch.empty((split_k, m, n), dtype=torch.float32, device=x.device)
        o_s0, o_s1 = out.stride(0), out.stride(1)
    splitk_gemm_kernel[(strips, split_k)](
        x, w, out, m, n, k, k_per_split, x.stride(0), w.stride(0), o_s0, o_s1,
        BLOCK_M=max(16, next_pow2(m)), BLOCK_N=BLOCK_N, BLOCK_K=BLOCK_K,
    )
    y = out if split_k == 1 else out.sum(0).to(x.dtype)
    return y if bias is None else y + bias


def linear(x: Tensor, w: Tensor, bias: Tensor | None = None, gemv: str = "cublas") -> Tensor:
    """x @ w.T (+ bias) with the `gemv` choice: "cublas" (F.linear) or "triton_splitk" for <= 16 rows."""
    if gemv == "triton_splitk" and x.dim() == 2 and x.shape[0] <= MAX_ROWS and use_triton(x):
        return splitk_linear(x, w, bias)
    return F.linear(x, w, bias)


MAX_FUSED_ROWS = 8
"""Most rows `fused_linear` takes in Triton: each row is one more pass over the weight tile in registers."""


def fused_linear(x: Tensor, w: Tensor, bias: Tensor | None = None, *, norm_weight: Tensor | None = None,
                 eps: float = 0.0, up: Tensor | None = None, residual: Tensor | None = None,
                 impl: Impl = None) -> Tensor:
    """A projection with what surrounds it in a decode layer, in one kernel for <= 8 rows:

        a = rms_norm(x, norm_weight, eps)   if norm_weight is given (x is the residual stream)
          = silu(x) * up                    if up is given (x is the gate projection's output)
          = x                               otherwise
        y = a @ w.T (+ bias), rounded to the model dtype, then (+ residual) if given.

    x, up, residual: [M, K] / [M, N] rows (any row stride); w: [N, K] row-major. The PyTorch path
    composes the same rounding steps (`rms_norm_torch`, F.silu(x) * up, F.linear, +) and serves any M.
    """
    assert norm_weight is None or up is None, "a projection takes a norm or a SiLU prologue, not both"
    m, k = x.shape
    n = w.shape[0]
    if m > MAX_FUSED_ROWS or not use_triton(x, impl):
        if norm_weight is not None:
            x = rms_norm_torch(x, norm_weight, eps)
        elif up is not None:
            x = F.silu(x) * up
        y = F.linear(x, w, bias)
        return y if residual is None else y + residual
    from athanor.kernels.jit.fused_gemv import fused_gemv_kernel, fused_gemv_tuned

    assert w.stride(1) == 1 and x.stride(1) == 1 and (up is None or up.stride(1) == 1)
    assert residual is None or residual.stride(1) == 1
    y = torch.empty((m, n), dtype=x.dtype, device=x.device)
    if m == 0:
        return y
    # fp32 partials of split-K configs: [SPLIT_K, strips, BLOCK_M, BLOCK_N] fits in max split x M x N rounded up.
    workspace = torch.empty(8 * next_pow2(m) * (n + 64), dtype=torch.float32, device=x.device)
    args = (x, up if up is not None else x, w, bias if bias is not None else w,
            norm_weight if norm_weight is not None else w, residual if residual is not None else y, y,
            workspace, tickets(x.device),
            m, n, k, eps, x.stride(0), up.stride(0) if up is not None else 0, w.stride(0),
            residual.stride(0) if residual is not None else 0, y.stride(0))
    flags = {"NORM": norm_weight is not None, "SILU": up is not None, "BIAS": bias is not None,
             "RESIDUAL": residual is not None, "BLOCK_M": next_pow2(m), **pdl(x), "EARLY": PDL_EARLY}
    if interpreting():
        split = 3 if k >= 192 else 1  # the split-K path too, in the tests' small shapes
        fused_gemv_kernel[(cdiv(n, 16), split)](*args, **flags, BLOCK_N=16, BLOCK_K=64, SPLIT_K=split)
    else:
        fused_gemv_tuned[lambda meta: (cdiv(n, meta["BLOCK_N"]), meta["SPLIT_K"])](*args, **flags)
    return y
