"""The forward pass: prefill and decode composed from the pieces above, and `build`, the candidate's entry point."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from athanor.kernels import add_rms_norm, greedy, rms_norm
from athanor.model import BuildContext, DecodeBatch, Model, PrefillBatch
from athanor.model.attention import prefill_extent, token_rows
from athanor.moves.templates.fast.attention import Attention
from athanor.moves.templates.fast.fused import FusedDecode
from athanor.moves.templates.fast.kv_cache import KVCache
from athanor.moves.templates.fast.linear import Linears
from athanor.moves.templates.fast.mlp import MLP
from athanor.moves.templates.fast.moe import MoE
from athanor.moves.templates.fast.options import OPTIONS, impl
from athanor.moves.templates.fast.weights import Layer, embed, linear_weight

SEAM_VERSION = 2
"""The candidate seam this file follows (`athanor.model.seam.SEAM_VERSION`): a paged KV pool."""


class FastForward:
    """Prefill and decode with the kernels and layouts OPTIONS picks."""

    def __init__(self, model: Model, ctx: BuildContext) -> None:
        spec = model.spec
        beyond = spec.beyond_llama()
        if beyond:  # declined by name: its kernels would compute Llama's numerics, and the logits would be wrong
            raise NotImplementedError(f"{spec.name}: {', '.join(beyond)} not in this template's kernels; the "
                                      "reference forward serves this model")
        self.model, self.spec, self.ctx = model, spec, ctx
        self.eps = spec.rms_norm_eps
        # A MoE loop has data-dependent shapes and host syncs: such a decode cannot be captured.
        # The per-sequence and flex attention paths and the reference MoE loop sync with the host.
        self.graph_safe = (bool(OPTIONS["graphs"]) and OPTIONS["attention"] not in ("torch_per_seq", "torch_flex")
                           and (spec.moe is None or OPTIONS["moe"] != "loop"))
        self.layers = [Layer(model, i) for i in range(spec.num_layers)]
        self.embed, self.norm = model.get("embed"), model.get("norm")
        self.lm_head = linear_weight(model.get("lm_head"))
        self.linear = Linears(self.layers, self.lm_head, ctx.device, self.eps)
        self.cache = KVCache(spec, ctx)
        self.attention = Attention(spec, ctx, self.linear, self.cache)
        self.mlp = MLP(self.linear)
        self.moe = MoE(spec, self.linear, self.mlp)
        self.fused = FusedDecode(spec, self.layers, (self.embed, self.norm, self.lm_head), self.linear,
                                 self.attention, self.mlp, self.moe)
        if OPTIONS["lm_head"] == "triton_greedy":  # the engine takes the greedy steps' tokens from this forward
            self.decode_greedy = self._decode_greedy
        self._decode_layers = self.decode_layers
        # Compiled for fixed shapes: the engine pads decode to its buckets and compiles each at the swap.
        self.static_shapes = OPTIONS["compile"] is not None
        if OPTIONS["compile"] is not None:
            # No "reduce-overhead": the engine captures the whole step in its own CUDA graphs.
            self._decode_layers = torch.compile(self.decode_layers, mode=OPTIONS["compile"], dynamic=False)

    @property
    def routing_observer(self) -> Callable[[int, Tensor], None] | None:
        """Called with (layer, topk_ids [N, top_k]) on every MoE layer when set (routing capture)."""
        return self.moe.routing_observer

    @routing_observer.setter
    def routing_observer(self, observer: Callable[[int, Tensor], None] | None) -> None:
        self.moe.routing_observer = observer

    def _norm(self, x: Tensor, residual: Tensor | None, w: Tensor) -> tuple[Tensor, Tensor]:
        """(rms_norm(x + residual), x + residual); the first layer has no residual yet."""
        if residual is None:
            return rms_norm(x, w, self.eps, impl=impl("rmsnorm")), x
        return add_rms_norm(x, residual, w, self.eps, impl=impl("rmsnorm"))

    def _mlp(self, i: int, layer: Layer, h: Tensor) -> Tensor:
        return self.moe(i, layer, h) if layer.moe else self.mlp(layer, h)

    def _logits(self, x: Tensor, residual: Tensor) -> Tensor:
        h, _ = self._norm(x, residual, self.norm)
        return self.linear(h, self.lm_head)

    # -- the seam ----------------------------------------------------------------------------------------------
    def prefill(self, batch: PrefillBatch) -> Tensor:
        extent = prefill_extent(batch.cu_seqlens, batch.seq_lens)
        token_slots = token_rows(batch.cu_seqlens, batch.slots, batch.tokens.shape[0])
        x: Tensor = F.embedding(batch.tokens, self.embed)  # [T, H]
        residual: Tensor | None = None
        for i, layer in enumerate(self.layers):
            h, residual = self._norm(x, residual, layer.attn_norm)
            out = self.attention.prefill(i, layer, h, batch, token_slots, extent)
            x = self.linear(out.flatten(1), layer.wo)
            h, residual = self._norm(x, residual, layer.mlp_norm)
            x = self._mlp(i, layer, h)
        assert residual is not None
        last = batch.cu_seqlens[1:] - 1
        return self._logits(x[last], residual[last])

    def decode_layers(self, tokens: Tensor, positions: Tensor, slots: Tensor,
                      greedy_tokens: bool = False) -> Tensor | tuple[Tensor, Tensor]:
        """Logits [B, vocab] of one decode step; a pure function of its inputs and the caches (compilable). With
        `greedy_tokens`, (argmax [B], logits) where the LM head's kernel makes the argmax (`FusedDecode`)."""
        if self.fused.takes(tokens):
            return self.fused(tokens, positions, slots, greedy_tokens)
        kv_lens = self.attention.kv_lens(positions)
        x = embed(tokens, self.embed)  # [B, H]
        residual: Tensor | None = None
        for i, layer in enumerate(self.layers):
            h, residual = self._norm(x, residual, layer.attn_norm)
            attn = self.attention.decode(i, layer, h, positions, slots, kv_lens)
            x = self.linear(attn.flatten(1), layer.wo)
            h, residual = self._norm(x, residual, layer.mlp_norm)
            x = self._mlp(i, layer, h)
        assert residual is not None
        return self._logits(x, residual)

    def decode(self, batch: DecodeBatch) -> Tensor:
        logits = self._decode_layers(batch.tokens, batch.positions, batch.slots)
        assert isinstance(logits, Tensor)
        return logits

    def _decode_greedy(self, batch: DecodeBatch) -> tuple[Tensor, Tensor]:
        """`decode_greedy` of the seam (bound as it with lm_head="triton_greedy"): the step's greedy tokens with its
        logits, the tokens made in the LM head's kernel on the fused layer's path, by `greedy` after it elsewhere."""
        out = self._decode_layers(batch.tokens, batch.positions, batch.slots, True)
        return out if isinstance(out, tuple) else (greedy(out), out)


def build(model: Model, ctx: BuildContext) -> FastForward:
    """The candidate entry point."""
    return FastForward(model, ctx)
