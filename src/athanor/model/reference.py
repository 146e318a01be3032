"""The reference forward pass: athanor's oracle and the baseline candidate.

Readable PyTorch for the dense Llama/Qwen family, its MoE cousins and Gemma 3, following the
candidate seam (docs/architecture.md): `build(model, ctx)` returns a `Forward` with `prefill` and
`decode` over per-sequence slots, whose tokens' keys and values live in the pages of a KV pool that
the engine's block table assigns (`ctx.block_table`). Every speedup athanor
reports is measured against this file, and `athanor candidate new` writes it out as the
starting point an agent or a person edits.

KV pool layout: per layer, k and v of shape [num_pages + 1, num_kv_heads, page_size, head_dim] in the
model's dtype; page `num_pages` is scratch. Token p of slot s sits in page block_table[s, p // page_size],
row p % page_size.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.nn.attention import sdpa_kernel

from athanor.model import BuildContext, DecodeBatch, Model, PrefillBatch, mla
from athanor.model.attention import (
    PREFILL_SDPA,
    decode_attention,
    gather_pages,
    pad_queries,
    prefill_attention,
    prefill_extent,
    slot_pages,
    token_pages,
    token_rows,
    window_mask,
)
from athanor.model.partial_attention import attend as partial_attend
from athanor.model.partial_attention import kv_places
from athanor.model.rope import apply_rope, rope_tables

SEAM_VERSION = 2
"""The candidate seam this file follows (`athanor.model.seam.SEAM_VERSION`)."""

def rms_norm(x: Tensor, weight: Tensor, eps: float, unit_offset: bool = False) -> Tensor:
    # Normalise in fp32 and cast back before the scale, as HF's LlamaRMSNorm does; Gemma's scales by (1 + weight) in
    # fp32 and casts after.
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    if unit_offset:
        return (xf * (1.0 + weight.float())).to(x.dtype)
    return weight * xf.to(x.dtype)


class ReferenceForward:
    """Prefill and decode for one model on one device, its keys and values in the pages of a KV pool."""

    def __init__(self, model: Model, ctx: BuildContext) -> None:
        spec = model.spec
        self.model = model
        self.spec = spec
        self.ctx = ctx
        # The MoE expert loop has data-dependent shapes, so only dense models can be captured.
        self.graph_safe = spec.moe is None
        self.cos, self.sin = rope_tables(spec, ctx.max_seq_len, ctx.device, ctx.dtype)  # [max_seq_len, D]
        # The windowed layers' own RoPE base (Gemma 3's local layers), where they have one.
        self.local_cos, self.local_sin = (rope_tables(spec, ctx.max_seq_len, ctx.device, ctx.dtype, local=True)
                                          if spec.local_rope_theta else (self.cos, self.sin))
        heads, k_dim, v_dim = (1, *mla.pool_dims(model)) if spec.mla else (spec.num_kv_heads,) + (spec.head_dim,) * 2
        self.k_cache = [ctx.allocate((ctx.num_pages + 1, heads, ctx.page_size, k_dim)) for _ in range(spec.num_layers)]
        self.v_cache = [ctx.allocate((ctx.num_pages + 1, heads, ctx.page_size, v_dim)) for _ in range(spec.num_layers)]
        self.block_table = ctx.table
        self.dcp = ctx.layout.dcp
        # Attention in parts (`athanor.model.partial_attention`): DCP's shares of the keys, or sinks beside them.
        self.partial = self.dcp > 1 or spec.attn_sinks
        if self.partial and spec.mla:
            raise ValueError("multi-head latent attention beside DCP or sinks is not in the reference")
        if self.dcp > 1 and (ctx.layout.tp > 1 or ctx.world_size != self.dcp):
            raise ValueError(f"dcp={self.dcp}: the reference splits the KV over all of its ranks, each with the whole "
                             f"attention (tp=1 on {self.dcp} ranks), not tp={ctx.layout.tp} on {ctx.world_size}")
        self.routing_observer: Callable[[int, Tensor], None] | None = None
        """Called with (layer, topk_ids [N, top_k]) on every MoE layer; the engine records routing with it."""

    # -- pieces -----------------------------------------------------------------------------
    def _norm(self, x: Tensor, name: str) -> Tensor:
        return rms_norm(x, self.model.get(name), self.spec.rms_norm_eps, self.spec.norm_unit_offset)

    def _qkv(self, i: int, h: Tensor, positions: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """q [N, Hq, D], k and v [N, Hkv, D] with RoPE applied, for hidden states h [N, H] (under MLA, what its
        cache keeps in their place: `mla.qkv`)."""
        m, spec = self.model, self.spec
        n = h.shape[0]
        local = spec.local_rope_theta and spec.window(i)
        cos, sin = (self.local_cos, self.local_sin) if local else (self.cos, self.sin)
        cos, sin = cos.index_select(0, positions), sin.index_select(0, positions)
        if spec.mla:
            return mla.qkv(m, i, h, cos, sin, self._norm)
        q = F.linear(h, m.layer(i, "wq"), m.layer(i, "bq") if spec.attn_bias else None)
        k = F.linear(h, m.layer(i, "wk"), m.layer(i, "bk") if spec.attn_bias else None)
        v = F.linear(h, m.layer(i, "wv"), m.layer(i, "bv") if spec.attn_bias else None)
        q = q.view(n, spec.num_heads, spec.head_dim)
        k = k.view(n, spec.num_kv_heads, spec.head_dim)
        v = v.view(n, spec.num_kv_heads, spec.head_dim)
        if spec.qk_norm:
            q, k = self._norm(q, f"layers.{i}.q_norm"), self._norm(k, f"layers.{i}.k_norm")
        return apply_rope(q, cos, sin), apply_rope(k, cos, sin), v

    def _embed(self, tokens: Tensor) -> Tensor:
        x = F.embedding(tokens, self.model.get("embed"))
        scale = self.spec.embed_scale
        return x * torch.tensor(scale, dtype=x.dtype) if scale != 1.0 else x

    def _attention_residual(self, i: int, x: Tensor, out: Tensor) -> Tensor:
        """x plus attention's output `out` [N, Hq * D] projected (and normed, with sandwich norms)."""
        y = self._attention_sum(F.linear(out, self.model.layer(i, "wo")))
        if self.spec.out_bias:
            y = y + self.model.layer(i, "bo")
        return x + (self._norm(y, f"layers.{i}.attn_post_norm") if self.spec.sandwich_norms else y)

    def _mlp_residual(self, i: int, x: Tensor) -> Tensor:
        y = self._mlp_sum(i, self._mlp(i, self._norm(x, f"layers.{i}.mlp_norm")))
        return x + (self._norm(y, f"layers.{i}.mlp_post_norm") if self.spec.sandwich_norms else y)

    def _mlp(self, i: int, x: Tensor) -> Tensor:
        if self.spec.moe_layer(i):
            return self._moe(i, x)
        m = self.model
        return swiglu(x, m.layer(i, "w_gate"), m.layer(i, "w_up"), m.layer(i, "w_down"), self._act)

    def _moe(self, i: int, x: Tensor) -> Tensor:
        """Top-k routed SwiGLU experts (+ optional shared expert) for x [N, H]."""
        moe, m = self.spec.moe, self.model
        assert moe is not None
        topk_ids, topk_weights = route(
            F.linear(x, m.layer(i, "router"), m.layer(i, "router_logit_bias") if moe.logit_bias else None),
            moe.top_k, moe.scoring, moe.renormalize,
            m.weights.get(f"layers.{i}.router_bias"), (moe.num_groups, moe.top_groups), moe.routed_scale,
        )
        if self.routing_observer is not None:
            self.routing_observer(i, topk_ids)
        names = ("w_gate", "w_up", "w_down") + (("b_gate", "b_up", "b_down") if moe.expert_bias else ())
        experts = {name: m.layer(i, f"experts.{name}") for name in names}
        # Under EP this rank holds a block of the experts (the first one `first`); the others' tokens are theirs.
        held = experts["w_gate"].shape[0]
        first = (self.ctx.rank % self.ctx.layout.ep) * held if held < moe.num_experts else 0
        out = torch.zeros_like(x)
        for e in torch.unique(topk_ids).tolist():
            if not first <= e < first + held:
                continue
            token_idx, k_idx = torch.nonzero(topk_ids == e, as_tuple=True)
            y = self._expert({name: t[e - first] for name, t in experts.items()}, x[token_idx])
            out.index_add_(0, token_idx, y * topk_weights[token_idx, k_idx, None].to(x.dtype))
        # A shared expert whole on every rank (EP without TP) is added once, by the first.
        if moe.shared_intermediate_size and (self.ctx.layout.tp > 1 or self.ctx.rank % self.ctx.layout.ep == 0):
            shared = swiglu(x, m.layer(i, "shared.w_gate"), m.layer(i, "shared.w_up"), m.layer(i, "shared.w_down"),
                            self._act)
            if moe.shared_gate:
                shared = torch.sigmoid(F.linear(x, m.layer(i, "shared.gate"))) * shared
            out = out + shared
        return out

    @property
    def _act(self) -> Callable[[Tensor], Tensor]:
        """The gated MLPs' activation: SwiGLU's silu or GeGLU's tanh gelu."""
        return F.silu if self.spec.activation == "silu" else gelu_tanh

    def _expert(self, w: dict[str, Tensor], x: Tensor) -> Tensor:
        """One expert (its weights `w`, biases `b_*` where it has them) on x [N, H]: SwiGLU, or gpt-oss's clamped one."""
        moe = self.spec.moe
        assert moe is not None
        b = {name: w.get(name) for name in ("b_gate", "b_up", "b_down")}
        gate, up = F.linear(x, w["w_gate"], b["b_gate"]), F.linear(x, w["w_up"], b["b_up"])
        if moe.swiglu_limit:
            gate, up = gate.clamp(max=moe.swiglu_limit), up.clamp(-moe.swiglu_limit, moe.swiglu_limit)
            hidden = (up + 1) * gate * torch.sigmoid(gate * moe.swiglu_alpha)
        else:
            hidden = self._act(gate) * up
        down_bias = b["b_down"]
        layout = self.ctx.layout
        if down_bias is not None and layout.tp > 1 and layout.ep == 1:  # experts split by columns over the TP ranks:
            down_bias = down_bias / layout.tp  # each adds its share, and the sum adds it once
        return F.linear(hidden, w["w_down"], down_bias)

    # Layouts over several ranks (`athanor.model.shard`): TP leaves partial sums after attention's output
    # projection and the MLP's down projection, EP after the routed experts each rank holds; a DP replica's (or
    # EP's replicated attention's) results are whole already.
    def _attention_sum(self, t: Tensor) -> Tensor:
        return self.ctx.all_reduce(t) if self.ctx.layout.tp > 1 else t

    def _mlp_sum(self, i: int, t: Tensor) -> Tensor:
        split = self.ctx.layout.tp > 1 or (self.spec.moe_layer(i) and self.ctx.layout.ep > 1)
        return self.ctx.all_reduce(t) if split else t

    def _logits(self, x: Tensor) -> Tensor:
        logits = F.linear(self._norm(x, "norm"), self.model.get("lm_head"))
        cap = self.spec.final_logit_softcap
        return torch.tanh(logits / cap) * cap if cap else logits

    def _expander(self, i: int) -> Callable[[Tensor, Tensor], tuple[Tensor, Tensor]] | None:
        """What turns layer i's gathered cache rows into keys and values (MLA's expansion), if anything does."""
        return (lambda k, v: mla.expand(self.model, i, k, v)) if self.spec.mla else None

    def _sinks(self, i: int) -> Tensor | None:
        return self.model.layer(i, "sinks") if self.spec.attn_sinks else None

    def _kv_places(self, slots: Tensor, positions: Tensor) -> tuple[Tensor, Tensor]:
        """Where token positions[n] of slot slots[n] is written: its page and row (under DCP, of this rank's share)."""
        if self.dcp > 1:
            return kv_places(self.block_table, slots, positions, self.ctx.page_size, self.ctx.rank % self.dcp,
                             self.dcp, self.ctx.num_pages)
        return token_pages(self.block_table, slots, positions, self.ctx.page_size)

    # -- the seam ---------------------------------------------------------------------------
    def prefill(self, batch: PrefillBatch) -> Tensor:
        with sdpa_kernel(list(PREFILL_SDPA), set_priority=True):
            return self._prefill(batch)

    def _prefill(self, batch: PrefillBatch) -> Tensor:
        spec = self.spec
        extent = prefill_extent(batch.cu_seqlens, batch.seq_lens)
        token_slots = token_rows(batch.cu_seqlens, batch.slots, batch.tokens.shape[0])
        pages, rows = self._kv_places(token_slots, batch.positions)
        x = self._embed(batch.tokens)  # [T, H]
        for i in range(spec.num_layers):
            q, k, v = self._qkv(i, self._norm(x, f"layers.{i}.attn_norm"), batch.positions)
            self.k_cache[i][pages, :, rows] = k
            self.v_cache[i][pages, :, rows] = v
            if self.partial:
                padded, q_pos, unpad = pad_queries(q, batch.cu_seqlens, batch.seq_lens, extent.max_new)
                out = unpad(partial_attend(padded.transpose(1, 2), q_pos, self.k_cache[i], self.v_cache[i],
                                           self.block_table, batch.slots, self.ctx, spec.window(i),
                                           spec.softmax_scale, self._sinks(i)).transpose(1, 2))
            else:
                out = prefill_attention(q, self.k_cache[i], self.v_cache[i], batch.cu_seqlens, batch.slots,
                                        self.block_table, batch.seq_lens, extent, spec.window(i), spec.softmax_scale,
                                        self._expander(i))
            x = self._mlp_residual(i, self._attention_residual(i, x, out.flatten(1)))
        last = batch.cu_seqlens[1:] - 1
        return self._logits(x[last])

    def decode(self, batch: DecodeBatch) -> Tensor:
        spec = self.spec
        positions, slots = batch.positions, batch.slots
        # Eagerly, attend only over the longest live context; under CUDA-graph capture the
        # shape must be static, so attend over every page a slot may hold, with a mask.
        kv_len = self.ctx.max_seq_len if is_capturing(positions) else int(positions.max()) + 1
        table = slot_pages(self.block_table, slots, kv_len, self.ctx.page_size)  # [B, pages]
        key_pos = torch.arange(table.shape[1] * self.ctx.page_size, device=positions.device)[None, :]
        masks = {w: window_mask(key_pos, positions[:, None], w) for w in {spec.window(i) for i in range(spec.num_layers)}}
        pages, rows = self._kv_places(slots, positions)
        x = self._embed(batch.tokens)  # [B, H]
        for i in range(spec.num_layers):
            q, k, v = self._qkv(i, self._norm(x, f"layers.{i}.attn_norm"), positions)
            self.k_cache[i][pages, :, rows] = k
            self.v_cache[i][pages, :, rows] = v
            if self.partial:
                out = partial_attend(q[:, :, None], positions[:, None], self.k_cache[i], self.v_cache[i],
                                     self.block_table, slots, self.ctx, spec.window(i), spec.softmax_scale,
                                     self._sinks(i)).flatten(1)
            else:
                keys, values = gather_pages(self.k_cache[i], table), gather_pages(self.v_cache[i], table)
                if spec.mla:
                    keys, values = mla.expand(self.model, i, keys, values)
                out = decode_attention(q, keys, values, masks[spec.window(i)], spec.softmax_scale)
            x = self._mlp_residual(i, self._attention_residual(i, x, out))
        return self._logits(x)


def swiglu(x: Tensor, w_gate: Tensor, w_up: Tensor, w_down: Tensor, act: Callable[[Tensor], Tensor] = F.silu) -> Tensor:
    """The gated MLP: SwiGLU with silu, GeGLU with `gelu_tanh`."""
    return F.linear(act(F.linear(x, w_gate)) * F.linear(x, w_up), w_down)


def gelu_tanh(x: Tensor) -> Tensor:
    return F.gelu(x, approximate="tanh")


def route(
    router_logits: Tensor, top_k: int, scoring: str, renormalize: bool, selection_bias: Tensor | None = None,
    groups: tuple[int, int] = (1, 1), scale: float = 1.0,
) -> tuple[Tensor, Tensor]:
    """Top-k expert ids [N, k] and their weights [N, k] fp32 from router logits [N, E].

    `selection_bias` shifts which experts are chosen but not their weights (DeepSeek-V3's
    e_score_correction_bias); athanor also uses it to replay a measured routing profile. `groups` (G, g): only the
    experts of the g groups (of G) whose two best choice scores sum highest are eligible; `scale` multiplies the
    weights (DeepSeek-V3's group-limited routing and routed_scaling_factor).
    """
    logits = router_logits.float()
    scores = torch.softmax(logits, dim=-1) if scoring == "softmax" else torch.sigmoid(logits)
    chooser = scores if selection_bias is None else scores + selection_bias.float()
    num_groups, top_groups = groups
    if num_groups > 1:
        by_group = chooser.view(chooser.shape[0], num_groups, -1)
        best = torch.topk(by_group.topk(2, dim=-1).values.sum(-1), top_groups, dim=-1).indices
        eligible = torch.zeros_like(by_group[..., 0], dtype=torch.bool).scatter_(1, best, True)
        chooser = by_group.masked_fill(~eligible[..., None], float("-inf")).view_as(chooser)
    topk_ids = torch.topk(chooser, top_k, dim=-1).indices
    topk_weights = scores.gather(1, topk_ids)
    if renormalize:
        topk_weights = topk_weights / topk_weights.sum(dim=-1, keepdim=True)
    return topk_ids, topk_weights * scale if scale != 1.0 else topk_weights


def is_capturing(t: Tensor) -> bool:
    return t.is_cuda and torch.cuda.is_current_stream_capturing()


def build(model: Model, ctx: BuildContext) -> ReferenceForward:
    """The candidate entry point."""
    return ReferenceForward(model, ctx)
