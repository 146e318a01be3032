"""A MoE layer's block: the router's top-k, the chosen experts, and the shared expert where there is one."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from athanor.kernels import moe_experts
from athanor.kernels import route as route_kernel
from athanor.model import ModelSpec
from athanor.moves.templates.fast.linear import Linears
from athanor.moves.templates.fast.mlp import MLP
from athanor.moves.templates.fast.options import OPTIONS, impl
from athanor.moves.templates.fast.weights import Layer


class MoE:
    """Every MoE layer's block on OPTIONS["moe"]'s expert backend and OPTIONS["routing"]'s router kernel."""

    def __init__(self, spec: ModelSpec, linear: Linears, mlp: MLP) -> None:
        self.spec, self.linear, self.mlp = spec, linear, mlp
        self.routing_observer: Callable[[int, Tensor], None] | None = None
        """Called with (layer, topk_ids [N, top_k]) on every MoE layer when set (routing capture)."""

    def __call__(self, i: int, layer: Layer, x: Tensor) -> Tensor:
        """Layer i's block for its normed hidden states x [N, H]."""
        moe = self.spec.moe
        assert moe is not None
        topk_ids, topk_weights = route_kernel(self.linear(x, layer.router), moe.top_k, moe.scoring, moe.renormalize,
                                              layer.router_bias, impl=impl("routing"))
        if self.routing_observer is not None:
            self.routing_observer(i, topk_ids)
        out = moe_experts(x, layer.experts_gate_up, layer.experts_down, topk_ids, topk_weights,
                          backend=str(OPTIONS["moe"]))
        if layer.has_mlp:
            shared = self.mlp(layer, x)
            if layer.shared_gate is not None:
                shared = torch.sigmoid(F.linear(x, layer.shared_gate)) * shared
            out = out + shared
        return out
