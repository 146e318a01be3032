"""A fast forward pass for the dense Llama/Qwen family and its MoE cousins, one switch per move.

This is a candidate file (see DESIGN.md, "The candidate seam"): `build(model, ctx)` returns a
`Forward`. It computes what `athanor.model.reference` computes, with the choices in `OPTIONS`
below: fused weights, Triton kernels from `athanor.kernels`, a KV-cache layout, torch.compile,
CUDA-graph safety, and (quality mode only) linear layers on lower-precision weight copies.
`athanor.moves.render` rewrites only the OPTIONS block; everything else is ordinary code an agent
may edit. Each option is documented by its `Move` in `athanor.moves`.

KV cache: per layer, k and v indexed as [max_seqs + 1, num_kv_heads, max_seq_len, head_dim]
(for kv_layout "token_major" that is a permuted view of [slots, max_seq_len, heads, D] storage).
"""

from __future__ import annotations

from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.nn.attention import SDPBackend, sdpa_kernel

from athanor.kernels import (
    KVWrite,
    RouterLogits,
    add_rms_norm,
    decode_attention,
    decode_attention_flex,
    decode_attention_per_seq,
    embedding,
    fused_linear,
    fused_linear_argmax,
    greedy,
    linear,
    linear_route,
    moe_block,
    moe_experts,
    qkv_rope_cache,
    rms_norm,
    rope,
    rope_and_cache,
    rope_cache_attention,
    routed_experts,
    router_topk,
    use_triton,
)
from athanor.kernels import route as route_kernel
from athanor.kernels import silu_mul as silu_mul_kernel
from athanor.kernels.onednn import has_onednn, onednn_linear, pack_weight
from athanor.model import BuildContext, DecodeBatch, Model, PrefillBatch
from athanor.model.reference import (  # the oracle's frequencies (Llama-3 scaling included) and SDPA backends
    PREFILL_SDPA,
    rope_inv_freq,
)

# --- OPTIONS (rendered by athanor.moves.render) ---
OPTIONS: dict[str, Any] = {
    "fused_qkv": False,
    "fused_gate_up": False,
    "rmsnorm": "torch",
    "rope": "torch",
    "attention": "torch",
    "sdpa": None,
    "kv_layout": "head_major",
    "gemv": "cublas",
    "silu_mul": "torch",
    "moe": "loop",
    "routing": "torch",
    "compile": None,
    "graphs": True,
    "linear_dtype": None,
    "merge_early": False,
    "early_keys": False,
    "split_early": False,
    "lm_head": "linear",
    "embedding": "torch",
    "evict_weights": None,
}
# --- end OPTIONS ---

FUSED_ROWS = 1
"""Most decode rows that take the fused-GEMV layer (gemv="triton_fused"); more go through cuBLAS. Measured
on an H200: at 1 row the fused GEMVs beat cuBLAS + the separate norm/SiLU kernels on every projection of
llama-3.2-1b and llama-3.1-8b; at 4 rows they were 1.1-2.7x slower (each row is one more pass of the
weight tile through the FMA units)."""

ONEDNN_DECODE_ROWS = 32
"""Most rows a linear layer sends through oneDNN with gemv="onednn_decode"; one row and more rows (prefills) go
through MKL's sgemm. Measured on the 2-core AVX2 VM with one thread (fp32, SmolLM2's shapes, bench/cpu_gemv_rows.py):
oneDNN 0.77-1.32x at 16 rows and 1.5-2.0x on the LM head, but 0.33-0.89x at one row on the projections and
0.94-0.97x at 384 rows (the whole 384-token prefill 5-13% slower, batch-1 decode 17-22%)."""


def impl(option: str) -> Literal["torch"] | None:
    """The `impl` argument for a kernel: "torch" forces the fallback; "triton..." values pass None,
    which runs Triton wherever it can (CUDA, or TRITON_INTERPRET=1) and PyTorch elsewhere."""
    return None if str(OPTIONS[option]).startswith("triton") else "torch"


def sdpa(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, causal: bool) -> Tensor:
    """Prefill's scaled_dot_product_attention on OPTIONS["sdpa"]'s backend (the math kernel as its fallback),
    or on the reference's (`PREFILL_SDPA`: flash, then efficient attention; never cuDNN's)."""
    name = OPTIONS["sdpa"]
    backends = PREFILL_SDPA if name is None else (getattr(SDPBackend, str(name).upper()), SDPBackend.MATH)
    with sdpa_kernel(list(dict.fromkeys(backends)), set_priority=True):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal, enable_gqa=True)


def linear_weight(w: Tensor) -> Tensor:
    """A weight as `_linear` reads it: a copy in OPTIONS["linear_dtype"] when that is set (the model's
    own tensor when it is unset or the model is in that dtype already)."""
    dtype = OPTIONS["linear_dtype"]
    return w if dtype is None else w.to(getattr(torch, dtype))


class Layer:
    """One layer's weights, transformed once in build() (fused copies are this candidate's memory)."""

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


class FastForward:
    """Prefill and decode with the kernels and layouts OPTIONS picks."""

    def __init__(self, model: Model, ctx: BuildContext) -> None:
        spec = model.spec
        self.model, self.spec, self.ctx = model, spec, ctx
        self.eps = spec.rms_norm_eps
        # A MoE loop has data-dependent shapes and host syncs: such a decode cannot be captured.
        # The per-sequence and flex attention paths and the reference MoE loop sync with the host.
        self.graph_safe = (bool(OPTIONS["graphs"]) and OPTIONS["attention"] not in ("torch_per_seq", "torch_flex")
                           and (spec.moe is None or OPTIONS["moe"] != "loop"))
        # Attention without host syncs (graphs and torch.compile need it; costs a masked full-cache read in torch).
        self.static = bool(OPTIONS["graphs"]) or OPTIONS["compile"] is not None
        # RoPE and the cache write inside the fused QKV projection (the fused-GEMV layer only; one-kernel
        # attention does them itself).
        self.qkv_epilogue = (OPTIONS["rope"] == "triton_qkv_epilogue" and bool(OPTIONS["fused_qkv"])
                             and OPTIONS["attention"] != "triton_fused")
        # The fused-GEMV layer's weights read evict-first from L2 (they are read once a step), or the experts' only.
        self.evict_all = OPTIONS["evict_weights"] == "all"
        # The Triton split-KV attention adds the 1 to each row's position itself (`lens_offset`): one launch fewer.
        self.lens_offset = 1 if OPTIONS["attention"] == "triton_split_kv" else 0
        self.layers = [Layer(model, i) for i in range(spec.num_layers)]
        self.embed, self.norm, self.lm_head = model.get("embed"), model.get("norm"), model.get("lm_head")
        self.lm_head = linear_weight(self.lm_head)
        positions = torch.arange(ctx.max_seq_len, dtype=torch.float32)
        freqs = torch.outer(positions, rope_inv_freq(spec))
        emb = torch.cat((freqs, freqs), dim=-1)  # [max_seq_len, D]
        self.cos = emb.cos().to(device=ctx.device, dtype=ctx.dtype).contiguous()
        self.sin = emb.sin().to(device=ctx.device, dtype=ctx.dtype).contiguous()
        self.k_cache = [self._allocate_cache() for _ in range(spec.num_layers)]
        self.v_cache = [self._allocate_cache() for _ in range(spec.num_layers)]
        self.routing_observer = None
        """Called with (layer, topk_ids [N, top_k]) on every MoE layer when set (routing capture)."""
        self.packed = (self._pack_linears() if str(OPTIONS["gemv"]).startswith("onednn") and ctx.device.type == "cpu"
                       else {})
        """oneDNN copies of the weights `_linear` reads, by id of the weight (empty: F.linear)."""
        if OPTIONS["lm_head"] == "triton_greedy":  # the engine takes the greedy steps' tokens from this forward
            self.decode_greedy = self._decode_greedy
        self._decode_layers = self.decode_layers
        if OPTIONS["compile"] is not None:
            # No "reduce-overhead": the engine captures the whole step in its own CUDA graphs.
            self._decode_layers = torch.compile(self.decode_layers, mode=OPTIONS["compile"], dynamic=False)

    def _allocate_cache(self) -> Tensor:
        s, c = self.spec, self.ctx
        if OPTIONS["kv_layout"] == "token_major":  # [slots, L, Hkv, D]: each token's heads are adjacent
            return c.allocate((c.max_seqs + 1, c.max_seq_len, s.num_kv_heads, s.head_dim)).transpose(1, 2)
        return c.allocate((c.max_seqs + 1, s.num_kv_heads, c.max_seq_len, s.head_dim))

    def _pack_linears(self) -> dict[int, Tensor]:
        """Each weight `_linear` reads, reordered once for oneDNN (none where this torch or CPU lacks it for
        the weight's dtype: those run `linear`)."""
        names = ("wq", "wk", "wv", "wqkv", "wo", "w_gate", "w_up", "w_gate_up", "w_down", "router")
        weights = [w for layer in self.layers for w in (getattr(layer, n, None) for n in names)
                   if isinstance(w, Tensor)]
        return {id(w): pack_weight(w) for w in [*weights, self.lm_head] if has_onednn(w.dtype)}

    # -- pieces -----------------------------------------------------------------------------
    def _linear(self, x: Tensor, w: Tensor, b: Tensor | None = None) -> Tensor:
        if w.dtype != x.dtype:  # linear_dtype: compute in the weight's dtype, hand back the model's
            return self._linear(x.to(w.dtype), w, b).to(x.dtype)
        packed = self.packed.get(id(w))
        if packed is not None and (OPTIONS["gemv"] == "onednn" or 2 <= x.shape[0] <= ONEDNN_DECODE_ROWS):
            return onednn_linear(x, packed, b)
        return linear(x, w, b, gemv=str(OPTIONS["gemv"]))

    def _norm(self, x: Tensor, residual: Tensor | None, w: Tensor) -> tuple[Tensor, Tensor]:
        """(rms_norm(x + residual), x + residual); the first layer has no residual yet."""
        if residual is None:
            return rms_norm(x, w, self.eps, impl=impl("rmsnorm")), x
        return add_rms_norm(x, residual, w, self.eps, impl=impl("rmsnorm"))

    def _project(self, h: Tensor, w: Tensor, b: Tensor | None, norm: Tensor | None) -> Tensor:
        """h @ w.T (+ b); with `norm`, h is the residual stream and is RMS-normed inside the GEMV."""
        if norm is None:
            return self._linear(h, w, b)
        return fused_linear(h, w, b, norm_weight=norm, eps=self.eps, evict_first=self.evict_all)

    def _qkv(self, layer: Layer, h: Tensor, norm: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor]:
        """q [N, Hq, D], k and v [N, Hkv, D] (not q/k-normed, not rotated: `_qk_norm`, `_attend`) for hidden
        states h [N, H] (with `norm`: for rms_norm(h, norm), computed inside the projections)."""
        s, n = self.spec, h.shape[0]
        if OPTIONS["fused_qkv"]:
            qkv = self._project(h, layer.wqkv, layer.bqkv, norm)
            q_dim, kv_dim = s.num_heads * s.head_dim, s.num_kv_heads * s.head_dim
            q, k, v = qkv[:, :q_dim], qkv[:, q_dim:q_dim + kv_dim], qkv[:, q_dim + kv_dim:]
        else:
            q, k, v = (self._project(h, layer.wq, layer.bq, norm), self._project(h, layer.wk, layer.bk, norm),
                       self._project(h, layer.wv, layer.bv, norm))
        q = q.view(n, s.num_heads, s.head_dim)
        k = k.view(n, s.num_kv_heads, s.head_dim)
        v = v.view(n, s.num_kv_heads, s.head_dim)
        return q, k, v

    def _qk_norm(self, layer: Layer, q: Tensor, k: Tensor) -> tuple[Tensor, Tensor]:
        """Qwen3's per-head RMSNorm of q and k (the identity for models without one)."""
        if layer.q_norm is None or layer.k_norm is None:
            return q, k
        return (rms_norm(q, layer.q_norm, self.eps, impl=impl("rmsnorm")),
                rms_norm(k, layer.k_norm, self.eps, impl=impl("rmsnorm")))

    def _gate_up(self, layer: Layer, x: Tensor, norm: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """The gate and up projections of x (one GEMM on a fused weight, its halves as views); with `norm`,
        x is the residual stream, RMS-normed inside the GEMV."""
        if OPTIONS["fused_gate_up"]:
            gate_up = self._project(x, layer.w_gate_up, None, norm)
            width = gate_up.shape[1] // 2
            return gate_up[:, :width], gate_up[:, width:]
        return self._project(x, layer.w_gate, None, norm), self._project(x, layer.w_up, None, norm)

    def _swiglu(self, layer: Layer, x: Tensor) -> Tensor:
        return self._linear(silu_mul_kernel(*self._gate_up(layer, x), impl=impl("silu_mul")), layer.w_down)

    def _mlp(self, i: int, layer: Layer, x: Tensor) -> Tensor:
        if not layer.moe:
            return self._swiglu(layer, x)
        moe = self.spec.moe
        assert moe is not None
        topk_ids, topk_weights = route_kernel(self._linear(x, layer.router), moe.top_k, moe.scoring, moe.renormalize,
                                              layer.router_bias, impl=impl("routing"))
        if self.routing_observer is not None:
            self.routing_observer(i, topk_ids)
        out = moe_experts(x, layer.experts_gate_up, layer.experts_down, topk_ids, topk_weights,
                          backend=str(OPTIONS["moe"]))
        if layer.has_mlp:
            shared = self._swiglu(layer, x)
            if layer.shared_gate is not None:
                shared = torch.sigmoid(F.linear(x, layer.shared_gate)) * shared
            out = out + shared
        return out

    def _logits(self, x: Tensor, residual: Tensor) -> Tensor:
        h, _ = self._norm(x, residual, self.norm)
        return self._linear(h, self.lm_head)

    # -- the seam ---------------------------------------------------------------------------
    def prefill(self, batch: PrefillBatch) -> Tensor:
        cu, starts, slots = batch.cu_seqlens.tolist(), batch.seq_lens.tolist(), batch.slots.tolist()
        x: Tensor = F.embedding(batch.tokens, self.embed)  # [T, H]
        residual: Tensor | None = None
        for i, layer in enumerate(self.layers):
            h, residual = self._norm(x, residual, layer.attn_norm)
            q, k, v = self._qkv(layer, h)
            q, k = rope(*self._qk_norm(layer, q, k), self.cos, self.sin, batch.positions, impl=impl("rope"))
            out = torch.empty_like(q)  # [T, Hq, D]
            for b, slot in enumerate(slots):
                lo, hi, start = cu[b], cu[b + 1], starts[b]
                end = start + hi - lo
                self.k_cache[i][slot, :, start:end] = k[lo:hi].transpose(0, 1)
                self.v_cache[i][slot, :, start:end] = v[lo:hi].transpose(0, 1)
                keys, values = self.k_cache[i][slot, :, :end], self.v_cache[i][slot, :, :end]  # [Hkv, end, D]
                if start == 0:
                    mask, causal = None, True
                else:  # a continued prefill: query j sits at position start + j
                    q_pos = torch.arange(start, end, device=x.device)
                    mask, causal = torch.arange(end, device=x.device)[None, :] <= q_pos[:, None], False
                attn = sdpa(q[lo:hi].transpose(0, 1)[None], keys[None], values[None], mask, causal)  # [1, Hq, n, D]
                out[lo:hi] = attn[0].transpose(0, 1)
            x = self._linear(out.flatten(1), layer.wo)
            h, residual = self._norm(x, residual, layer.mlp_norm)
            x = self._mlp(i, layer, h)
        assert residual is not None
        last = batch.cu_seqlens[1:] - 1
        return self._logits(x[last], residual[last])

    def _attend(self, i: int, layer: Layer, q: Tensor, k: Tensor, v: Tensor, positions: Tensor, slots: Tensor,
                kv_lens: Tensor) -> Tensor:
        """q/k-norm and rotate q and k, write k and v into layer i's cache, attend over kv_lens (+ `lens_offset`)
        keys: [B, Hq, D]."""
        kc, vc = self.k_cache[i], self.v_cache[i]
        if OPTIONS["attention"] == "triton_fused":  # RoPE, the q/k norms and the cache write inside attention
            return rope_cache_attention(q, k, v, self._kv_write(i, layer, positions, slots), kv_lens, self.eps,
                                        static=self.static, impl=impl("attention"))
        if OPTIONS["rope"] in ("triton_fused_cache", "triton_qkv_epilogue"):  # the q/k norms inside the same kernel
            q = rope_and_cache(q, k, v, self.cos, self.sin, positions, slots, kc, vc, q_norm=layer.q_norm,
                               k_norm=layer.k_norm, eps=self.eps)
        else:
            q, k = self._qk_norm(layer, q, k)
            q, k = rope(q, k, self.cos, self.sin, positions, impl=impl("rope"))
            kc[slots, :, positions] = k
            vc[slots, :, positions] = v
        return self._attention(i, q.contiguous(), slots, kv_lens)

    def _attention(self, i: int, q: Tensor, slots: Tensor, kv_lens: Tensor) -> Tensor:
        """Attention of rotated q [B, Hq, D] over layer i's cache, which holds the new token already: kv_lens
        (+ `lens_offset`) keys a row."""
        kc, vc = self.k_cache[i], self.v_cache[i]
        if OPTIONS["attention"] == "torch_per_seq":
            return decode_attention_per_seq(q, kc, vc, slots, kv_lens)
        if OPTIONS["attention"] == "torch_flex":
            return decode_attention_flex(q, kc, vc, slots, kv_lens)
        return decode_attention(q, kc, vc, slots, kv_lens, static=self.static, impl=impl("attention"),
                                merge_early=bool(OPTIONS["merge_early"]), lens_offset=self.lens_offset,
                                early_keys=bool(OPTIONS["early_keys"]), split_early=bool(OPTIONS["split_early"]))

    def _attend_fused(self, i: int, layer: Layer, h: Tensor, positions: Tensor, slots: Tensor,
                      kv_lens: Tensor, tokens: Tensor | None = None) -> Tensor:
        """Attention of layer i for the residual stream h: the QKV projection with the RMSNorm inside, then
        `_attend`; with `qkv_epilogue`, RoPE, the q/k norms and the cache write happen inside the projection
        too (`qkv_rope_cache`: the last strip of each head rotates it). `tokens`: h is still to be gathered from the
        embedding, by the projection's kernel, which writes it (qkv_epilogue only)."""
        if not self.qkv_epilogue:
            q, k, v = self._qkv(layer, h, norm=layer.attn_norm)
            return self._attend(i, layer, q, k, v, positions, slots, kv_lens)
        kv = self._kv_write(i, layer, positions, slots)
        gather = None if tokens is None else (tokens, h)  # the embedding's rows, read by the kernel into h
        q = qkv_rope_cache(h if gather is None else self.embed, layer.wqkv, layer.bqkv, layer.attn_norm, self.eps,
                           self.spec.num_heads, kv, gather=gather, evict_first=self.evict_all)
        return self._attention(i, q, slots, kv_lens)

    def _kv_write(self, i: int, layer: Layer, positions: Tensor, slots: Tensor) -> KVWrite:
        """Where layer i's new keys and values go, and the tables and norms they are rotated with."""
        return KVWrite(self.cos, self.sin, positions, slots, self.k_cache[i], self.v_cache[i], layer.q_norm,
                       layer.k_norm)

    def _kv_lens(self, positions: Tensor) -> Tensor:
        """What the attention reads as each row's key count, once per step: positions + 1 (the new token is written
        before attention reads), or the positions themselves where the attention adds the 1 (`lens_offset`)."""
        return positions if self.lens_offset else positions + 1

    def decode_layers(self, tokens: Tensor, positions: Tensor, slots: Tensor,
                      greedy_tokens: bool = False) -> Tensor | tuple[Tensor, Tensor]:
        """Logits [B, vocab] of one decode step; a pure function of its inputs and the caches (compilable). With
        `greedy_tokens`, (argmax [B], logits) where the LM head's kernel makes the argmax (`_decode_fused`)."""
        if (OPTIONS["gemv"] == "triton_fused" and (self.spec.moe is None or OPTIONS["moe"] == "triton")
                and tokens.shape[0] <= FUSED_ROWS and use_triton(tokens)):
            return self._decode_fused(tokens, positions, slots, greedy_tokens)
        kv_lens = self._kv_lens(positions)
        x = self._embedding(tokens)  # [B, H]
        residual: Tensor | None = None
        for i, layer in enumerate(self.layers):
            h, residual = self._norm(x, residual, layer.attn_norm)
            q, k, v = self._qkv(layer, h)
            attn = self._attend(i, layer, q, k, v, positions, slots, kv_lens)
            x = self._linear(attn.flatten(1), layer.wo)
            h, residual = self._norm(x, residual, layer.mlp_norm)
            x = self._mlp(i, layer, h)
        assert residual is not None
        return self._logits(x, residual)

    def _decode_fused(self, tokens: Tensor, positions: Tensor, slots: Tensor,
                      greedy_tokens: bool = False) -> Tensor | tuple[Tensor, Tensor]:
        """decode_layers with the norms, SiLU-mul and residual adds folded into the projections
        (`fused_linear`): per dense layer QKV, RoPE (+ cache), attention, O, gate/up and down only; a MoE
        layer's experts run as `_moe_fused`. h is the residual stream: the reference's x after each
        `x = x + ...`."""
        kv_lens = self._kv_lens(positions)
        # The gather inside the first layer's QKV kernel (one row, with the RoPE epilogue): one launch fewer.
        fold = OPTIONS["embedding"] == "triton_qkv_prologue" and self.qkv_epilogue and tokens.shape[0] == 1
        h = self.embed.new_empty((1, self.spec.hidden_size)) if fold else self._embedding(tokens)  # [B, H]
        for i, layer in enumerate(self.layers):
            attn = self._attend_fused(i, layer, h, positions, slots, kv_lens, tokens if fold and i == 0 else None)
            if layer.moe and not layer.has_mlp and OPTIONS["routing"] == "triton_moe_block":
                h = self._moe_block(i, layer, attn.flatten(1), h)
                continue
            if layer.moe and not layer.has_mlp and OPTIONS["routing"] == "triton_o_epilogue":
                moe = self.spec.moe
                assert moe is not None
                # The router's logits summed by the O projection as it writes h: no router GEMV launch.
                h, _, ids, weights = linear_route(attn.flatten(1), layer.wo, h, layer.router, layer.mlp_norm,
                                                  self.eps, moe.top_k, moe.scoring, moe.renormalize, layer.router_bias,
                                                  evict_first=self.evict_all)
                h = self._experts_fused(i, layer, h, ids, weights)
                continue
            h = fused_linear(attn.flatten(1), layer.wo, residual=h, evict_first=self.evict_all)
            if layer.moe:
                h = self._moe_fused(i, layer, h)
                continue
            gate, up = self._gate_up(layer, h, norm=layer.mlp_norm)
            h = fused_linear(gate, layer.w_down, up=up, residual=h, evict_first=self.evict_all)
        if OPTIONS["lm_head"] != "linear" and self.lm_head.dtype == h.dtype:  # the final norm inside the GEMV
            if greedy_tokens and OPTIONS["lm_head"] == "triton_greedy":  # and the argmax folded in
                return fused_linear_argmax(h, self.lm_head, self.norm, self.eps, evict_first=self.evict_all)
            return fused_linear(h, self.lm_head, norm_weight=self.norm, eps=self.eps, evict_first=self.evict_all)
        return self._linear(rms_norm(h, self.norm, self.eps, impl=impl("rmsnorm")), self.lm_head)

    def _embedding(self, tokens: Tensor) -> Tensor:
        """The decode rows' embeddings [B, H]."""
        if OPTIONS["embedding"] != "torch":
            return embedding(tokens, self.embed)
        return F.embedding(tokens, self.embed)

    def _moe_fused(self, i: int, layer: Layer, h: Tensor) -> Tensor:
        """h + the MoE block for a few tokens: router (RMSNorm inside) and top-k, then the chosen experts'
        gate and up projections in one launch (RMSNorm inside again) and their down projections,
        weighted, summed and added to h in another (`expert_gemv`: expert ids read on the device, no
        grouping, no sort)."""
        moe = self.spec.moe
        assert moe is not None
        if layer.has_mlp:  # a shared expert: the general path
            return h + self._mlp(i, layer, rms_norm(h, layer.mlp_norm, self.eps, impl=impl("rmsnorm")))
        # The block's RMSNorm is done inside the router's GEMV and again inside the experts' gate/up GEMV.
        topk_ids: Tensor | RouterLogits
        topk_weights: Tensor | RouterLogits
        if OPTIONS["routing"] == "triton_router_epilogue":  # the top-k inside the router's GEMV
            topk_ids, topk_weights = router_topk(h, layer.router, layer.mlp_norm, self.eps, moe.top_k, moe.scoring,
                                                 moe.renormalize, layer.router_bias)
        else:
            logits = fused_linear(h, layer.router, norm_weight=layer.mlp_norm, eps=self.eps)
            router = RouterLogits(logits, moe.top_k, moe.scoring, moe.renormalize, layer.router_bias)
            if OPTIONS["routing"] == "triton_expert_prologue" and self.routing_observer is None:
                topk_ids = topk_weights = router  # each expert program ranks the logits itself
            else:
                topk_ids, topk_weights = router.route(impl=impl("routing"))
        return self._experts_fused(i, layer, h, topk_ids, topk_weights)

    def _moe_block(self, i: int, layer: Layer, attn: Tensor, h: Tensor) -> Tensor:
        """h + the O projection of attn, then + the routed experts (no shared one): one persistent launch in Triton
        (`moe_block`: grid-wide waits where the kernel boundaries were), the router's logits summed by the O
        projection as in `triton_o_epilogue`. Measured slower than `triton_o_epilogue`'s four launches on an H200."""
        moe = self.spec.moe
        assert moe is not None
        gate_up_w = layer.experts_gate_up
        if isinstance(gate_up_w, tuple):
            w_gate, w_up = gate_up_w
        else:  # one [E, 2 * NI, H] tensor: its halves
            w_gate, w_up = gate_up_w.chunk(2, dim=1)
        block = moe_block(attn, layer.wo, h, layer.router, layer.mlp_norm, self.eps, moe.top_k, moe.scoring,
                          moe.renormalize, layer.router_bias, w_gate, w_up, layer.experts_down)
        if self.routing_observer is not None:
            self.routing_observer(i, block.ids)
        return block.out

    def _experts_fused(self, i: int, layer: Layer, h: Tensor, topk_ids: Tensor | RouterLogits,
                       topk_weights: Tensor | RouterLogits) -> Tensor:
        """h + the routed experts of `_moe_fused`, their ids and weights given."""
        if self.routing_observer is not None:
            assert isinstance(topk_ids, Tensor)
            self.routing_observer(i, topk_ids)
        gate_up_w = layer.experts_gate_up
        w, w2 = gate_up_w if isinstance(gate_up_w, tuple) else (gate_up_w, None)
        return routed_experts(h, w, w2, layer.experts_down, topk_ids, topk_weights, layer.mlp_norm, self.eps,
                              evict_first=OPTIONS["evict_weights"] is not None)

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
