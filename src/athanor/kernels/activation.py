"""SiLU-and-multiply, the SwiGLU activation between the gate/up and down projections."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from athanor.kernels.dispatch import Impl, cdiv, use_triton


def silu_mul(gate: Tensor, up: Tensor, impl: Impl = None) -> Tensor:
    """silu(gate) * up. gate, up: [N, I], rows may be strided (e.g. the halves of a fused [N, 2I])."""
    if not use_triton(gate, impl):
        return F.silu(gate) * up
    from athanor.kernels.jit.activation import silu_mul_kernel

    n, width = gate.shape
    if gate.stride(-1) != 1 or up.stride(-1) != 1:
        gate, up = gate.contiguous(), up.contiguous()
    out = torch.empty((n, width), dtype=gate.dtype, device=gate.device)
    block = 1024
    if n:
        silu_mul_kernel[(n, cdiv(width, block))](
            gate, up, out, gate.stride(0), up.stride(0), out.stride(0), width, BLOCK=block
        )
    return out

