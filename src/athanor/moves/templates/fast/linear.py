"""Every linear layer of the step: cuBLAS (MKL's sgemm on a CPU), Triton's split-K GEMV, the fused GEMV with
an RMSNorm inside, or oneDNN on weights packed once (CPU)."""

from __future__ import annotations

import torch
from torch import Tensor

from athanor.kernels import fused_linear, linear
from athanor.kernels.onednn import has_onednn, onednn_linear, pack_weight
from athanor.moves.templates.fast.options import OPTIONS
from athanor.moves.templates.fast.weights import Layer

ONEDNN_DECODE_ROWS = 32
"""Most rows a linear layer sends through oneDNN with gemv="onednn_decode": with the one thread an engine worker
runs on a small CPU, MKL's sgemm is faster at one row and at prefill's hundreds (chosen by `athanor bench decode`
on a CPU)."""

PACKED_NAMES = ("wq", "wk", "wv", "wqkv", "wo", "w_gate", "w_up", "w_gate_up", "w_down", "router")
"""The layer weights a linear layer reads (routed experts run in their own kernels)."""


class Linears:
    """h @ w.T (+ b) for every weight of the step, through OPTIONS["gemv"]'s kernel."""

    def __init__(self, layers: list[Layer], lm_head: Tensor, device: torch.device, eps: float) -> None:
        self.eps = eps
        self.evict_first = OPTIONS["evict_weights"] == "all"
        """The fused GEMVs read their weights evict-first from L2: each is read once a step."""
        onednn = str(OPTIONS["gemv"]).startswith("onednn") and device.type == "cpu"
        self.packed = self._pack(layers, lm_head) if onednn else {}
        """oneDNN copies of the weights, by id of the weight (empty: `linear`)."""

    @staticmethod
    def _pack(layers: list[Layer], lm_head: Tensor) -> dict[int, Tensor]:
        """Each weight reordered once for oneDNN (none where this torch or CPU lacks it for the weight's dtype:
        those run `linear`)."""
        weights = [w for layer in layers for w in (getattr(layer, n, None) for n in PACKED_NAMES)
                   if isinstance(w, Tensor)]
        return {id(w): pack_weight(w) for w in [*weights, lm_head] if has_onednn(w.dtype)}

    def __call__(self, x: Tensor, w: Tensor, b: Tensor | None = None) -> Tensor:
        if w.dtype != x.dtype:  # linear_dtype: compute in the weight's dtype, hand back the model's
            return self(x.to(w.dtype), w, b).to(x.dtype)
        packed = self.packed.get(id(w))
        if packed is not None and (OPTIONS["gemv"] == "onednn" or 2 <= x.shape[0] <= ONEDNN_DECODE_ROWS):
            return onednn_linear(x, packed, b)
        return linear(x, w, b, gemv=str(OPTIONS["gemv"]))

    def project(self, h: Tensor, w: Tensor, b: Tensor | None, norm: Tensor | None) -> Tensor:
        """h @ w.T (+ b); with `norm`, h is the residual stream and is RMS-normed inside the GEMV."""
        if norm is None:
            return self(h, w, b)
        return fused_linear(h, w, b, norm_weight=norm, eps=self.eps, evict_first=self.evict_first)
