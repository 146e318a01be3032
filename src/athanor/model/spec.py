"""Architecture specs: the dense Llama/Qwen family, its MoE cousins (Mixtral, Qwen3-MoE) and Gemma 3.

A `ModelSpec` says everything a forward pass needs to know about shapes and numerics; the
weights themselves live in `Model` under the canonical names that `weight_shapes` lists.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Literal


@dataclass(frozen=True)
class RopeScaling:
    """Frequency scaling of RoPE, as HF configs' `rope_scaling` (`athanor.model.rope.rope_inv_freq`)."""

    factor: float = 8.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192
    kind: str = "llama3"
    """`rope_type`: "llama3" (Llama 3.1's smoothed band), "linear" (positions divided by `factor`) or "yarn"."""
    beta_fast: float = 32.0
    """YaRN: rotations in the original context below which a dimension is interpolated, above `beta_slow` kept."""
    beta_slow: float = 1.0
    attention_factor: float = 1.0
    """YaRN: the scale of cos and sin (so of every attention logit's rotated part); 1 for the other kinds."""
    truncate: bool = True
    """YaRN: round the blended band's edges to whole dimensions (HF's default)."""


@dataclass(frozen=True)
class MoESpec:
    """A sparse mixture-of-experts MLP replacing the dense one in every layer."""

    num_experts: int
    top_k: int
    intermediate_size: int
    """Hidden width of each routed expert."""
    scoring: Literal["softmax", "sigmoid"] = "softmax"
    """How router logits become scores: softmax (Mixtral, Qwen3-MoE) or sigmoid (DeepSeek-V3 style)."""
    renormalize: bool = True
    """Rescale the top-k scores to sum to one (Mixtral, Qwen3-MoE with norm_topk_prob)."""
    shared_intermediate_size: int = 0
    """Width of an always-on shared expert; 0 means none."""
    shared_gate: bool = False
    """The shared expert's output is scaled by sigmoid(x @ shared_gate) (Qwen2-MoE style)."""
    logit_bias: bool = False
    """The router adds a bias (`router_logit_bias` [E]) to its logits, moving both the choice and the weights
    (gpt-oss); unlike `router_bias`, the offset athanor replays measured routing with, which moves the choice only."""
    expert_bias: bool = False
    """Each expert's projections have biases (`experts.b_gate`, `b_up` [E, I], `b_down` [E, H]; gpt-oss)."""
    swiglu_limit: float = 0.0
    """gpt-oss's clamped SwiGLU: gate clamped above at the limit and up to +-limit, then (up + 1) * gate *
    sigmoid(swiglu_alpha * gate); 0: SwiGLU."""
    swiglu_alpha: float = 1.702
    num_groups: int = 1
    """Group-limited routing (DeepSeek-V3): the experts in `num_groups` groups, only the `top_groups` groups with the
    highest sums of their two best choice scores eligible."""
    top_groups: int = 1
    routed_scale: float = 1.0
    """The routed experts' weights are multiplied by this (DeepSeek-V3's routed_scaling_factor)."""


@dataclass(frozen=True)
class MLASpec:
    """Multi-head latent attention (DeepSeek-V2/V3): keys and values expanded per head from a latent of
    `kv_rank` numbers a token (normed), beside one rotary key part shared by the heads; the query from a latent of
    `q_rank` (0: a plain projection). What is cached, and how, is the forward's choice: the reference caches the
    latent and the rotary part, as transformers does."""

    kv_rank: int
    q_rank: int
    nope_dim: int
    """Each head's key dimensions without position (the rest of its `head_dim` is `rope_dim`)."""
    rope_dim: int
    v_dim: int
    interleave: bool = True
    """RoPE rotates adjacent pairs (x0, x1), (x2, x3), ... rather than the two halves."""


@dataclass(frozen=True)
class ModelSpec:
    """The shape and numerics of one decoder-only transformer."""

    name: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    """Dense MLP width (unused by MoE layers)."""
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rope_theta: float = 10000.0
    rope_scaling: RopeScaling | None = None
    rms_norm_eps: float = 1e-5
    max_position_embeddings: int = 8192
    tie_embeddings: bool = False
    qk_norm: bool = False
    """RMSNorm over each head of q and k before RoPE (Qwen3)."""
    attn_bias: bool = False
    """Biases on the q, k, v projections (Qwen2)."""
    mla: MLASpec | None = None
    """Multi-head latent attention in place of q, k, v projections (`head_dim` = nope_dim + rope_dim)."""
    attn_sinks: bool = False
    """A learned logit per query head (`sinks` [Hq]) in every softmax of attention, with no value (gpt-oss)."""
    out_bias: bool = False
    """A bias on attention's output projection (`bo`), added once after the layout's sum: Llama's, Qwen3's and
    Gemma's `attention_bias` puts one there as well as on q, k and v."""
    moe: MoESpec | None = None
    family: str = "llama"
    """The HF architecture family the spec was read from or is saved as: llama, qwen2, qwen3, mixtral, qwen3_moe,
    gemma3_text, ..."""
    layer_windows: tuple[int, ...] = ()
    """Sliding-window attention: per layer, how many of the latest keys a query sees, its own among them (HF's
    `sliding_window` W: from position i, keys j with i - W < j <= i); 0 for a layer that sees every key. Empty: no
    layer has a window."""
    dense_layers: tuple[int, ...] = ()
    """In a MoE model, the layers whose MLP is dense (`intermediate_size` wide) instead: Qwen-MoE's
    `decoder_sparse_step` and `mlp_only_layers`."""
    local_rope_theta: float = 0.0
    """RoPE base of the windowed layers, which take no `rope_scaling` (Gemma 3's local layers); 0: every layer
    shares `rope_theta` and `rope_scaling`."""
    # Gemma's numerics (Gemma 3); the defaults are Llama's.
    norm_unit_offset: bool = False
    """RMSNorm scales by (1 + weight), in fp32 before the cast back, rather than by weight after it."""
    sandwich_norms: bool = False
    """A norm on attention's output and on the MLP's output before each residual add (`attn_post_norm`,
    `mlp_post_norm`), besides the norms on their inputs."""
    embed_scale: float = 1.0
    """Embeddings are multiplied by this (in the model's dtype) before the first layer: sqrt(hidden) for Gemma."""
    activation: Literal["silu", "gelu_tanh"] = "silu"
    """The dense MLP's gate activation: SwiGLU's silu, or GeGLU's tanh-approximated gelu."""
    attn_scale: float = 0.0
    """The attention logits' scale; 0: 1 / sqrt(head_dim). Gemma: 1 / sqrt(query_pre_attn_scalar)."""
    final_logit_softcap: float = 0.0
    """Logits become cap * tanh(logits / cap); 0: none."""

    def __post_init__(self) -> None:
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads {self.num_heads} is not a multiple of num_kv_heads {self.num_kv_heads}")
        if self.layer_windows and len(self.layer_windows) != self.num_layers:
            raise ValueError(f"layer_windows has {len(self.layer_windows)} entries for {self.num_layers} layers")

    def window(self, layer: int) -> int:
        """The keys layer `layer`'s attention sees back from a query (0: all of them)."""
        return self.layer_windows[layer] if self.layer_windows else 0

    @property
    def windowed(self) -> bool:
        return any(self.layer_windows)

    @property
    def rope_dim(self) -> int:
        """The dimensions of a head RoPE rotates."""
        return self.mla.rope_dim if self.mla else self.head_dim

    def moe_layer(self, layer: int) -> bool:
        return self.moe is not None and layer not in self.dense_layers

    def rope_theta_of(self, layer: int) -> float:
        return self.local_rope_theta if self.local_rope_theta and self.window(layer) else self.rope_theta

    @property
    def softmax_scale(self) -> float:
        return self.attn_scale or self.head_dim ** -0.5

    def beyond_llama(self) -> list[str]:
        """What this model computes that the Llama/Qwen numerics do not, by name (the fast template declines those)."""
        names = {"sliding-window attention": self.windowed, "local RoPE bases": bool(self.local_rope_theta),
                 "(1 + weight) norms": self.norm_unit_offset, "sandwich norms": self.sandwich_norms,
                 "scaled embeddings": self.embed_scale != 1.0, f"{self.activation} MLPs": self.activation != "silu",
                 "an attention scale": bool(self.attn_scale), "logit soft-capping": bool(self.final_logit_softcap),
                 "an output projection bias": self.out_bias, "dense layers among MoE ones": bool(self.dense_layers),
                 "attention sinks": self.attn_sinks, "multi-head latent attention": self.mla is not None,
                 "group-limited routing": bool(self.moe and (self.moe.num_groups > 1 or self.moe.routed_scale != 1)),
                 "gpt-oss experts": bool(self.moe and (self.moe.logit_bias or self.moe.expert_bias
                                                       or self.moe.swiglu_limit))}
        return [name for name, used in names.items() if used]

    @property
    def is_moe(self) -> bool:
        return self.moe is not None

    def with_layers(self, num_layers: int) -> ModelSpec:
        windows = self.layer_windows
        if windows:  # the first layers' windows, or the pattern repeated where the cut model is longer
            windows = tuple(windows[i % len(windows)] for i in range(num_layers))
        dense = tuple(i for i in self.dense_layers if i < num_layers)
        return dataclasses.replace(self, num_layers=num_layers, layer_windows=windows, dense_layers=dense)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @staticmethod
    def from_dict(d: dict[str, Any]) -> ModelSpec:
        d = dict(d)
        if d.get("rope_scaling"):
            d["rope_scaling"] = RopeScaling(**d["rope_scaling"])
        if d.get("moe"):
            d["moe"] = MoESpec(**d["moe"])
        if d.get("mla"):
            d["mla"] = MLASpec(**d["mla"])
        d["layer_windows"] = tuple(d.get("layer_windows") or ())
        d["dense_layers"] = tuple(d.get("dense_layers") or ())
        return ModelSpec(**d)

    def num_params(self) -> int:
        return sum(_numel(s) for s in weight_shapes(self).values())

    def active_params_per_token(self) -> int:
        """Parameters one token reads (MoE: only top_k routed experts)."""
        total = 0
        for name, shape in weight_shapes(self).items():
            n = _numel(shape)
            if ".experts." in name and self.moe is not None:
                n = n * self.moe.top_k // self.moe.num_experts
            total += n
        return total


def kv_cache_bytes(spec: ModelSpec, num_slots: int, max_seq_len: int, itemsize: int = 2) -> int:
    """Bytes of the keys and values of `num_slots` sequences of `max_seq_len` tokens each, every layer (what a KV pool
    needs for them, pages rounded away); under MLA, of the latent and the rotary key part the reference caches."""
    if spec.mla:
        return spec.num_layers * num_slots * max_seq_len * (spec.mla.kv_rank + spec.mla.rope_dim) * itemsize
    return 2 * spec.num_layers * num_slots * spec.num_kv_heads * max_seq_len * spec.head_dim * itemsize


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


def layer_weight_shapes(spec: ModelSpec, layer: int = 0) -> dict[str, tuple[int, ...]]:
    """Canonical weight names of layer `layer` (without the `layers.{i}.` prefix) and their shapes."""
    h, d = spec.hidden_size, spec.head_dim
    q_dim, kv_dim = spec.num_heads * d, spec.num_kv_heads * d
    shapes: dict[str, tuple[int, ...]] = {
        "attn_norm": (h,),
        "wq": (q_dim, h),
        "wk": (kv_dim, h),
        "wv": (kv_dim, h),
        "wo": (h, q_dim),
        "mlp_norm": (h,),
    }
    if spec.mla:
        mla = spec.mla
        del shapes["wk"], shapes["wv"]
        shapes["wo"] = (h, spec.num_heads * mla.v_dim)
        if mla.q_rank:
            del shapes["wq"]
            shapes.update(q_a=(mla.q_rank, h), q_a_norm=(mla.q_rank,), q_b=(q_dim, mla.q_rank))
        shapes.update(kv_a=(mla.kv_rank + mla.rope_dim, h), kv_a_norm=(mla.kv_rank,),
                      kv_b=(spec.num_heads * (mla.nope_dim + mla.v_dim), mla.kv_rank))
    if spec.sandwich_norms:
        shapes.update(attn_post_norm=(h,), mlp_post_norm=(h,))
    if spec.attn_bias:
        shapes.update(bq=(q_dim,), bk=(kv_dim,), bv=(kv_dim,))
    if spec.out_bias:
        shapes["bo"] = (h,)
    if spec.attn_sinks:
        shapes["sinks"] = (spec.num_heads,)
    if spec.qk_norm:
        shapes.update(q_norm=(d,), k_norm=(d,))
    moe = spec.moe if spec.moe_layer(layer) else None
    if moe is None:
        i = spec.intermediate_size
        shapes.update(w_gate=(i, h), w_up=(i, h), w_down=(h, i))
    else:
        e, i = moe.num_experts, moe.intermediate_size
        shapes["router"] = (e, h)
        shapes["experts.w_gate"] = (e, i, h)
        shapes["experts.w_up"] = (e, i, h)
        shapes["experts.w_down"] = (e, h, i)
        if moe.logit_bias:
            shapes["router_logit_bias"] = (e,)
        if moe.expert_bias:
            shapes.update({"experts.b_gate": (e, i), "experts.b_up": (e, i), "experts.b_down": (e, h)})
        if moe.shared_intermediate_size:
            s = moe.shared_intermediate_size
            shapes.update({"shared.w_gate": (s, h), "shared.w_up": (s, h), "shared.w_down": (h, s)})
            if moe.shared_gate:
                shapes["shared.gate"] = (1, h)
    return shapes


def weight_shapes(spec: ModelSpec) -> dict[str, tuple[int, ...]]:
    """Every canonical weight name of the model and its shape.

    Names: `embed`, `layers.{i}.<layer name>`, `norm`, and `lm_head` unless embeddings are tied.
    Optional per-layer `router_bias` [E] (a selection-only bias, used to replay routing) is
    allowed but not required.
    """
    shapes: dict[str, tuple[int, ...]] = {"embed": (spec.vocab_size, spec.hidden_size)}
    for layer in range(spec.num_layers):
        for name, shape in layer_weight_shapes(spec, layer).items():
            shapes[f"layers.{layer}.{name}"] = shape
    shapes["norm"] = (spec.hidden_size,)
    if not spec.tie_embeddings:
        shapes["lm_head"] = (spec.vocab_size, spec.hidden_size)
    return shapes
