"""The decode step on fused GEMVs: the norms, SiLU-mul, residual adds and routing inside the projections."""

from __future__ import annotations

from torch import Tensor

from athanor.kernels import (
    RouterLogits,
    fused_linear,
    fused_linear_argmax,
    linear_route,
    moe_block,
    qkv_rope_cache,
    rms_norm,
    routed_experts,
    router_topk,
    use_triton,
)
from athanor.model import ModelSpec
from athanor.moves.templates.fast.attention import Attention
from athanor.moves.templates.fast.linear import Linears
from athanor.moves.templates.fast.mlp import MLP
from athanor.moves.templates.fast.moe import MoE
from athanor.moves.templates.fast.options import OPTIONS, impl
from athanor.moves.templates.fast.weights import Layer, embed

FUSED_ROWS = 1
"""Most decode rows that take the fused-GEMV layer (gemv="triton_fused"); more go through cuBLAS. Each row is one
more pass of the weight tile through the FMA units, so the fused GEMVs beat cuBLAS and the separate norm and
SiLU-mul kernels at one row only (chosen by `athanor bench decode`)."""


class FusedDecode:
    """A decode step of at most FUSED_ROWS rows with gemv="triton_fused": per dense layer QKV, RoPE (+ cache),
    attention, O, gate/up and down only; a MoE layer's router and experts as fused GEMVs too. h is the residual
    stream: the reference's x after each `x = x + ...`."""

    def __init__(self, spec: ModelSpec, layers: list[Layer], head: tuple[Tensor, Tensor, Tensor], linear: Linears,
                 attention: Attention, mlp: MLP, moe: MoE) -> None:
        self.spec, self.eps, self.layers = spec, spec.rms_norm_eps, layers
        self.embed, self.norm, self.lm_head = head
        self.linear, self.attention, self.mlp, self.moe = linear, attention, mlp, moe
        self.evict_all = linear.evict_first
        # RoPE and the cache write inside the fused QKV projection (one-kernel attention does them itself).
        self.qkv_epilogue = (OPTIONS["rope"] == "triton_qkv_epilogue" and bool(OPTIONS["fused_qkv"])
                             and OPTIONS["attention"] != "triton_fused")

    def takes(self, tokens: Tensor) -> bool:
        """Whether a decode step of these rows runs here."""
        return (OPTIONS["gemv"] == "triton_fused" and (self.spec.moe is None or OPTIONS["moe"] == "triton")
                and tokens.shape[0] <= FUSED_ROWS and use_triton(tokens))

    def __call__(self, tokens: Tensor, positions: Tensor, slots: Tensor,
                 greedy_tokens: bool = False) -> Tensor | tuple[Tensor, Tensor]:
        """Logits [B, vocab] of one decode step; with `greedy_tokens` and lm_head="triton_greedy", (argmax [B],
        logits) with the argmax made in the LM head's kernel."""
        kv_lens = self.attention.kv_lens(positions)
        # The gather inside the first layer's QKV kernel (one row, with the RoPE epilogue): one launch fewer.
        fold = OPTIONS["embedding"] == "triton_qkv_prologue" and self.qkv_epilogue and tokens.shape[0] == 1
        h = self.embed.new_empty((1, self.spec.hidden_size)) if fold else embed(tokens, self.embed)  # [B, H]
        for i, layer in enumerate(self.layers):
            attn = self.attend(i, layer, h, positions, slots, kv_lens, tokens if fold and i == 0 else None)
            if layer.moe and not layer.has_mlp and OPTIONS["routing"] == "triton_moe_block":
                h = self.moe_block(i, layer, attn.flatten(1), h)
                continue
            if layer.moe and not layer.has_mlp and OPTIONS["routing"] == "triton_o_epilogue":
                moe = self.spec.moe
                assert moe is not None
                # The router's logits summed by the O projection as it writes h: no router GEMV launch.
                h, _, ids, weights = linear_route(attn.flatten(1), layer.wo, h, layer.router, layer.mlp_norm,
                                                  self.eps, moe.top_k, moe.scoring, moe.renormalize, layer.router_bias,
                                                  evict_first=self.evict_all)
                h = self.experts(i, layer, h, ids, weights)
                continue
            h = fused_linear(attn.flatten(1), layer.wo, residual=h, evict_first=self.evict_all)
            if layer.moe:
                h = self.moe_layer(i, layer, h)
                continue
            gate, up = self.mlp.gate_up(layer, h, norm=layer.mlp_norm)
            h = fused_linear(gate, layer.w_down, up=up, residual=h, evict_first=self.evict_all)
        if OPTIONS["lm_head"] != "linear" and self.lm_head.dtype == h.dtype:  # the final norm inside the GEMV
            if greedy_tokens and OPTIONS["lm_head"] == "triton_greedy":  # and the argmax folded in
                return fused_linear_argmax(h, self.lm_head, self.norm, self.eps, evict_first=self.evict_all)
            return fused_linear(h, self.lm_head, norm_weight=self.norm, eps=self.eps, evict_first=self.evict_all)
        return self.linear(rms_norm(h, self.norm, self.eps, impl=impl("rmsnorm")), self.lm_head)

    def attend(self, i: int, layer: Layer, h: Tensor, positions: Tensor, slots: Tensor, kv_lens: Tensor,
               tokens: Tensor | None = None) -> Tensor:
        """Attention of layer i for the residual stream h: the QKV projection with the RMSNorm inside, then
        `Attention.attend`; with `qkv_epilogue`, RoPE, the q/k norms and the cache write happen inside the
        projection too (`qkv_rope_cache`: the last strip of each head rotates it). `tokens`: h is still to be
        gathered from the embedding, by the projection's kernel, which writes it (qkv_epilogue only)."""
        if not self.qkv_epilogue:
            return self.attention.decode(i, layer, h, positions, slots, kv_lens, norm=layer.attn_norm)
        kv = self.attention.kv_write(i, layer, positions, slots)
        gather = None if tokens is None else (tokens, h)  # the embedding's rows, read by the kernel into h
        q = qkv_rope_cache(h if gather is None else self.embed, layer.wqkv, layer.bqkv, layer.attn_norm, self.eps,
                           self.spec.num_heads, kv, gather=gather, evict_first=self.evict_all)
        return self.attention.attention(i, q, slots, kv_lens)

    def moe_layer(self, i: int, layer: Layer, h: Tensor) -> Tensor:
        """h + the MoE block for a few tokens: router (RMSNorm inside) and top-k, then the chosen experts'
        gate and up projections in one launch (RMSNorm inside again) and their down projections,
        weighted, summed and added to h in another (expert ids read on the device, no grouping, no sort)."""
        moe = self.spec.moe
        assert moe is not None
        if layer.has_mlp:  # a shared expert: the general path
            return h + self.moe(i, layer, rms_norm(h, layer.mlp_norm, self.eps, impl=impl("rmsnorm")))
        topk_ids: Tensor | RouterLogits
        topk_weights: Tensor | RouterLogits
        if OPTIONS["routing"] == "triton_router_epilogue":  # the top-k inside the router's GEMV
            topk_ids, topk_weights = router_topk(h, layer.router, layer.mlp_norm, self.eps, moe.top_k, moe.scoring,
                                                 moe.renormalize, layer.router_bias)
        else:
            logits = fused_linear(h, layer.router, norm_weight=layer.mlp_norm, eps=self.eps)
            router = RouterLogits(logits, moe.top_k, moe.scoring, moe.renormalize, layer.router_bias)
            if OPTIONS["routing"] == "triton_expert_prologue" and self.moe.routing_observer is None:
                topk_ids = topk_weights = router  # each expert program ranks the logits itself
            else:
                topk_ids, topk_weights = router.route(impl=impl("routing"))
        return self.experts(i, layer, h, topk_ids, topk_weights)

    def moe_block(self, i: int, layer: Layer, attn: Tensor, h: Tensor) -> Tensor:
        """h + the O projection of attn, then + the routed experts (no shared one): one persistent launch
        (`moe_block`: grid-wide waits where the kernel boundaries were), the router's logits summed by the O
        projection as in `triton_o_epilogue`."""
        moe = self.spec.moe
        assert moe is not None
        gate_up_w = layer.experts_gate_up
        if isinstance(gate_up_w, tuple):
            w_gate, w_up = gate_up_w
        else:  # one [E, 2 * NI, H] tensor: its halves
            w_gate, w_up = gate_up_w.chunk(2, dim=1)
        block = moe_block(attn, layer.wo, h, layer.router, layer.mlp_norm, self.eps, moe.top_k, moe.scoring,
                          moe.renormalize, layer.router_bias, w_gate, w_up, layer.experts_down)
        if self.moe.routing_observer is not None:
            self.moe.routing_observer(i, block.ids)
        return block.out

    def experts(self, i: int, layer: Layer, h: Tensor, topk_ids: Tensor | RouterLogits,
                topk_weights: Tensor | RouterLogits) -> Tensor:
        """h + the routed experts of `moe_layer`, their ids and weights given."""
        if self.moe.routing_observer is not None:
            assert isinstance(topk_ids, Tensor)
            self.moe.routing_observer(i, topk_ids)
        gate_up_w = layer.experts_gate_up
        w, w2 = gate_up_w if isinstance(gate_up_w, tuple) else (gate_up_w, None)
        return routed_experts(h, w, w2, layer.experts_down, topk_ids, topk_weights, layer.mlp_norm, self.eps,
                              evict_first=OPTIONS["evict_weights"] is not None)
