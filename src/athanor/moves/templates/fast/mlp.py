"""The dense SwiGLU MLP, down(silu(gate(x)) * up(x)): a dense layer's, and a MoE layer's shared expert."""

from __future__ import annotations

from torch import Tensor

from athanor.kernels import silu_mul as silu_mul_kernel
from athanor.moves.templates.fast.linear import Linears
from athanor.moves.templates.fast.options import OPTIONS, impl
from athanor.moves.templates.fast.weights import Layer


class MLP:
    """The SwiGLU MLP of any layer that has one."""

    def __init__(self, linear: Linears) -> None:
        self.linear = linear

    def gate_up(self, layer: Layer, x: Tensor, norm: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """The gate and up projections of x (one GEMM on a fused weight, its halves as views); with `norm`,
        x is the residual stream, RMS-normed inside the GEMV."""
        if OPTIONS["fused_gate_up"]:
            gate_up = self.linear.project(x, layer.w_gate_up, None, norm)
            width = gate_up.shape[1] // 2
            return gate_up[:, :width], gate_up[:, width:]
        return self.linear.project(x, layer.w_gate, None, norm), self.linear.project(x, layer.w_up, None, norm)

    def __call__(self, layer: Layer, x: Tensor) -> Tensor:
        return self.linear(silu_mul_kernel(*self.gate_up(layer, x), impl=impl("silu_mul")), layer.w_down)
