"""The weights as the step reads them, transformed once in build(), and the token embedding's gather."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from athanor.kernels import embedding
from athanor.model import Model
from athanor.moves.templates.fast.options import OPTIONS


def linear_weight(w: Tensor) -> Tensor:
    """A weight as a linear layer reads it: a copy in OPTIONS["linear_dtype"] when that is set (the model's
    own tensor when it is unset or the model is in that dtype already)."""
    dtype = OPTIONS["linear_dtype"]
    return w if dtype is None else w.to(getattr(torch, dtype))


class Layer:
    """One layer's weights (fused copies are this candidate's memory)."""

    def __init__(self, model: Model, i: int) -> None:
        spec, get = model.spec, (lambda name: model.layer(i, name))
        self.attn_norm, self.mlp_norm, self.wo = get("attn_norm"), get("mlp_norm"), linear_weight(get("wo"))
        self.q_norm = get("q_norm") if spec.qk_norm else None
        self.k_norm = get("k_norm") if spec.qk_norm else None
        if OPTIONS["fused_qkv"]:
            self.wqkv = linear_weight(torch.cat([get("wq"), get("wk"), get("wv")]))  # [(Hq + 2 Hkv) D, H]
            bqkv = torch.cat([get("bq"), get("bk"), get("bv")]) if spec.attn_bias else None
            self.bqkv = linear_weight(bqkv) if bqkv is not None else None
        else:
            self.wq, self.wk, self.wv = (linear_weight(get(name)) for name in ("wq", "wk", "wv"))
            biases = [linear_weight(get(name)) if spec.attn_bias else None for name in ("bq", "bk", "bv")]
            self.bq: Tensor | None = biases[0]
            self.bk: Tensor | None = biases[1]
            self.bv: Tensor | None = biases[2]
        self.moe = spec.moe is not None
        prefix = "" if spec.moe is None else "shared."
        self.has_mlp = spec.moe is None or bool(spec.moe.shared_intermediate_size)
        if self.has_mlp:
            self.w_down = linear_weight(get(prefix + "w_down"))
            if OPTIONS["fused_gate_up"]:
                gate_up = torch.cat([get(prefix + "w_gate"), get(prefix + "w_up")])  # [2I, H]
                self.w_gate_up = linear_weight(gate_up)
            else:
                self.w_gate, self.w_up = (linear_weight(get(prefix + name)) for name in ("w_gate", "w_up"))
        if spec.moe is not None:
            self.router = get("router")
            self.router_bias = model.weights.get(f"layers.{i}.router_bias")
            self.shared_gate = get("shared.gate") if spec.moe.shared_gate else None
            self.experts_down = get("experts.w_down")
            gate, up = get("experts.w_gate"), get("experts.w_up")
            self.experts_gate_up: Tensor | tuple[Tensor, Tensor] = (
                torch.cat([gate, up], dim=1) if OPTIONS["fused_gate_up"] else (gate, up))  # [E, 2I, H]


def embed(tokens: Tensor, table: Tensor) -> Tensor:
    """The decode rows' embeddings [B, H]: with embedding="triton", a gather that lets the next kernel launch as
    it starts (under programmatic dependent launch)."""
    if OPTIONS["embedding"] != "torch":
        return embedding(tokens, table)
    return F.embedding(tokens, table)
