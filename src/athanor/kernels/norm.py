"""RMSNorm and the fused residual-add + RMSNorm that opens every attention and MLP block."""

from __future__ import annotations

import torch
from torch import Tensor

from athanor.kernels.dispatch import Impl, next_pow2, pdl, use_triton


def rms_norm_torch(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    """The reference's RMSNorm: normalise in fp32, cast back, then scale."""
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * xf.to(x.dtype)


def rms_norm(x: Tensor, weight: Tensor, eps: float, impl: Impl = None) -> Tensor:
    """RMSNorm over the last dim. x: [..., H]; weight: [H]. Also serves per-head q/k norms ([N, heads, D])."""
    if not use_triton(x, impl):
        return rms_norm_torch(x, weight, eps)
    out, _ = _launch(x, None, weight, eps)
    return out


def add_rms_norm(x: Tensor, residual: Tensor, weight: Tensor, eps: float, impl: Impl = None) -> tuple[Tensor, Tensor]:
    """(rms_norm(x + residual), x + residual) in one pass over memory.

    x, residual: [N, H] in the model dtype. The sum is what the next block adds its output to.
    """
    if not use_triton(x, impl):
        h = x + residual
        return rms_norm_torch(h, weight, eps), h
    out, summed = _launch(x, residual, weight, eps)
    assert summed is not None
    return out, summed


def _launch(x: Tensor, residual: Tensor | None, weight: Tensor, eps: float) -> tuple[Tensor, Tensor | None]:
    from athanor.kernels.jit.norm import rms_norm_kernel

    shape = x.shape
    hidden = shape[-1]
    x2 = x.reshape(-1, hidden)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    r2 = None if residual is None else residual.reshape(-1, hidden).contiguous()
    out = torch.empty((x2.shape[0], hidden), dtype=x.dtype, device=x.device)
    r_out = torch.empty_like(out) if residual is not None else out
    if x2.shape[0]:
        rms_norm_kernel[(x2.shape[0],)](
            x2, r2 if r2 is not None else x2, weight, out, r_out,
            x2.stride(0), r2.stride(0) if r2 is not None else 0, out.stride(0),
            hidden, eps,
            HAS_RESIDUAL=residual is not None, BLOCK=next_pow2(hidden), **pdl(x2),
        )
    return out.view(shape), (r_out.view(shape) if residual is not None else None)
