"""Attention: the QKV projection, q/k norms, RoPE, the KV-cache write and attention, in prefill and decode."""

from __future__ import annotations

from typing import Any

from torch import Tensor
from torch.nn.attention import SDPBackend, sdpa_kernel

from athanor.kernels import (
    KVWrite,
    decode_attention,
    decode_attention_flex,
    decode_attention_per_seq,
    prefill_attention,
    rms_norm,
    rope,
    rope_and_cache,
    rope_cache_attention,
)
from athanor.model import BuildContext, ModelSpec, PrefillBatch
from athanor.model.attention import PREFILL_SDPA, PrefillExtent
from athanor.model.rope import rope_tables
from athanor.moves.templates.fast.kv_cache import KVCache
from athanor.moves.templates.fast.linear import Linears
from athanor.moves.templates.fast.options import OPTIONS, impl
from athanor.moves.templates.fast.weights import Layer


def sdpa_backends() -> Any:
    """A context choosing prefill's scaled_dot_product_attention backends: OPTIONS["sdpa"]'s (the math kernel as its
    fallback), or the reference's (`PREFILL_SDPA`: flash, then efficient attention; never cuDNN's)."""
    name = OPTIONS["sdpa"]
    backends = PREFILL_SDPA if name is None else (getattr(SDPBackend, str(name).upper()), SDPBackend.MATH)
    return sdpa_kernel(list(dict.fromkeys(backends)), set_priority=True)


class Attention:
    """Every layer's attention over the KV cache; the O projection is the caller's."""

    def __init__(self, spec: ModelSpec, ctx: BuildContext, linear: Linears, cache: KVCache) -> None:
        self.spec, self.eps, self.linear, self.cache = spec, spec.rms_norm_eps, linear, cache
        # Attention without host syncs (graphs and torch.compile need it; costs a masked full-cache read in torch).
        self.static = bool(OPTIONS["graphs"]) or OPTIONS["compile"] is not None
        # The Triton split-KV attention adds the 1 to each row's position itself (`lens_offset`): one launch fewer.
        self.lens_offset = 1 if OPTIONS["attention"] == "triton_split_kv" else 0
        # The reference's tables (its RoPE scaling included), so the rotation matches the oracle's.
        self.cos, self.sin = rope_tables(spec, ctx.max_seq_len, ctx.device, ctx.dtype)

    def qkv(self, layer: Layer, h: Tensor, norm: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor]:
        """q [N, Hq, D], k and v [N, Hkv, D] (not q/k-normed, not rotated: `qk_norm`, `attend`) for hidden
        states h [N, H] (with `norm`: for rms_norm(h, norm), computed inside the projections)."""
        s, n = self.spec, h.shape[0]
        if OPTIONS["fused_qkv"]:
            qkv = self.linear.project(h, layer.wqkv, layer.bqkv, norm)
            q_dim, kv_dim = s.num_heads * s.head_dim, s.num_kv_heads * s.head_dim
            q, k, v = qkv[:, :q_dim], qkv[:, q_dim:q_dim + kv_dim], qkv[:, q_dim + kv_dim:]
        else:
            q, k, v = (self.linear.project(h, layer.wq, layer.bq, norm),
                       self.linear.project(h, layer.wk, layer.bk, norm),
                       self.linear.project(h, layer.wv, layer.bv, norm))
        q = q.view(n, s.num_heads, s.head_dim)
        k = k.view(n, s.num_kv_heads, s.head_dim)
        v = v.view(n, s.num_kv_heads, s.head_dim)
        return q, k, v

    def qk_norm(self, layer: Layer, q: Tensor, k: Tensor) -> tuple[Tensor, Tensor]:
        """Qwen3's per-head RMSNorm of q and k (the identity for models without one)."""
        if layer.q_norm is None or layer.k_norm is None:
            return q, k
        return (rms_norm(q, layer.q_norm, self.eps, impl=impl("rmsnorm")),
                rms_norm(k, layer.k_norm, self.eps, impl=impl("rmsnorm")))

    # -- prefill ---------------------------------------------------------------------------------------------
    def prefill(self, i: int, layer: Layer, h: Tensor, batch: PrefillBatch, token_slots: Tensor,
                extent: PrefillExtent) -> Tensor:
        """Layer i's attention [T, Hq, D] for the normed hidden states h [T, H] of a prefill batch (token_slots [T]:
        each token's slot; extent: the batch's `prefill_extent`): the keys and values cached, then every sequence's
        queries attending causally over its slot's keys, a continued prefill's too, in one call."""
        q, k, v = self.qkv(layer, h)
        q, k = rope(*self.qk_norm(layer, q, k), self.cos, self.sin, batch.positions, impl=impl("rope"))
        self.cache.write(i, token_slots, batch.positions, k, v)
        with sdpa_backends():
            return prefill_attention(q, self.cache.k[i], self.cache.v[i], batch.cu_seqlens, batch.slots,
                                     self.cache.table, batch.seq_lens, extent, impl=impl("prefill_attention"))

    # -- decode ----------------------------------------------------------------------------------------------
    def kv_lens(self, positions: Tensor) -> Tensor:
        """What the attention reads as each row's key count, once per step: positions + 1 (the new token is written
        before attention reads), or the positions themselves where the attention adds the 1 (`lens_offset`)."""
        return positions if self.lens_offset else positions + 1

    def decode(self, i: int, layer: Layer, h: Tensor, positions: Tensor, slots: Tensor, kv_lens: Tensor,
               norm: Tensor | None = None) -> Tensor:
        """Layer i's attention [B, Hq, D] for the hidden states h [B, H] of a decode step (with `norm`: h is the
        residual stream, RMS-normed inside the QKV projection)."""
        q, k, v = self.qkv(layer, h, norm)
        return self.attend(i, layer, q, k, v, positions, slots, kv_lens)

    def attend(self, i: int, layer: Layer, q: Tensor, k: Tensor, v: Tensor, positions: Tensor, slots: Tensor,
               kv_lens: Tensor) -> Tensor:
        """q/k-norm and rotate q and k, write k and v into layer i's cache, attend over kv_lens (+ `lens_offset`)
        keys: [B, Hq, D]."""
        if OPTIONS["attention"] == "triton_fused":  # RoPE, the q/k norms and the cache write inside attention
            return rope_cache_attention(q, k, v, self.kv_write(i, layer, positions, slots), kv_lens, self.eps,
                                        static=self.static, impl=impl("attention"))
        if OPTIONS["rope"] in ("triton_fused_cache", "triton_qkv_epilogue"):  # the q/k norms inside the same kernel
            q = rope_and_cache(q, k, v, self.cos, self.sin, positions, slots, self.cache.table, self.cache.k[i],
                               self.cache.v[i], q_norm=layer.q_norm, k_norm=layer.k_norm, eps=self.eps)
        else:
            q, k = self.qk_norm(layer, q, k)
            q, k = rope(q, k, self.cos, self.sin, positions, impl=impl("rope"))
            self.cache.write(i, slots, positions, k, v)
        return self.attention(i, q.contiguous(), slots, kv_lens)

    def attention(self, i: int, q: Tensor, slots: Tensor, kv_lens: Tensor) -> Tensor:
        """Attention of rotated q [B, Hq, D] over layer i's cache, which holds the new token already: kv_lens
        (+ `lens_offset`) keys a row."""
        kc, vc, table = self.cache.k[i], self.cache.v[i], self.cache.table
        if OPTIONS["attention"] == "torch_per_seq":
            return decode_attention_per_seq(q, kc, vc, slots, table, kv_lens)
        if OPTIONS["attention"] == "torch_flex":
            return decode_attention_flex(q, kc, vc, slots, table, kv_lens)
        return decode_attention(q, kc, vc, slots, table, kv_lens, static=self.static, impl=impl("attention"),
                                merge_early=bool(OPTIONS["merge_early"]), lens_offset=self.lens_offset,
                                early_keys=bool(OPTIONS["early_keys"]), split_early=bool(OPTIONS["split_early"]))

    def kv_write(self, i: int, layer: Layer, positions: Tensor, slots: Tensor) -> KVWrite:
        """Where layer i's new keys and values go, and the tables and norms they are rotated with."""
        return KVWrite(self.cos, self.sin, positions, slots, self.cache.table, self.cache.k[i], self.cache.v[i],
                       layer.q_norm, layer.k_norm)
