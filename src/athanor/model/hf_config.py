"""HF `config.json`, both ways: a `ModelSpec` from a config of the families athanor reads (every field that changes
the math read, or the directory refused in one line naming it), and the config HF loads a saved spec from."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Literal

import torch

from athanor.errors import ConfigError, ModelLoadError
from athanor.model.spec import MLASpec, ModelSpec, MoESpec, RopeScaling

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
ARCHITECTURES = {
    "llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM", "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM", "mixtral": "MixtralForCausalLM", "qwen3_moe": "Qwen3MoeForCausalLM",
    "qwen2_moe": "Qwen2MoeForCausalLM", "gemma3_text": "Gemma3ForCausalLM", "gpt_oss": "GptOssForCausalLM",
    "deepseek_v3": "DeepseekV3ForCausalLM",
}


def read_config(directory: Path) -> tuple[ModelSpec, torch.dtype]:
    path = directory / "config.json"
    try:
        cfg = json.loads(path.read_text())
    except FileNotFoundError:
        raise ModelLoadError(f"{path}: missing; an HF model directory needs config.json") from None
    except json.JSONDecodeError as e:
        raise ModelLoadError(f"{path}: not valid JSON ({e.msg} at line {e.lineno})") from None
    dtype = _DTYPES.get(str(cfg.get("torch_dtype") or cfg.get("dtype")), torch.float32)
    return spec_from_config(cfg, path), dtype


GEMMA3_DEFAULTS: dict[str, Any] = {
    "vocab_size": 262_208, "hidden_size": 2304, "intermediate_size": 9216, "num_hidden_layers": 26,
    "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256, "hidden_activation": "gelu_pytorch_tanh",
    "max_position_embeddings": 131_072, "rms_norm_eps": 1e-6, "tie_word_embeddings": True, "rope_theta": 1e6,
    "rope_local_base_freq": 1e4, "query_pre_attn_scalar": 256, "sliding_window": 4096, "sliding_window_pattern": 6,
}
"""Gemma3TextConfig's defaults: a multimodal checkpoint's `text_config` lists only the fields that differ."""


def gemma3_text(cfg: dict[str, Any], path: Path) -> tuple[dict[str, Any], float]:
    """A Gemma 3 config (the text model's, or the multimodal one's `text_config`) with its defaults filled in, its
    global layers' RoPE as `rope_parameters`, and its layer types; and the local layers' RoPE base."""
    text = cfg.get("text_config") if cfg.get("model_type") == "gemma3" else cfg
    if not isinstance(text, dict):
        raise ModelLoadError(f"{path}: a gemma3 config needs its text model's fields in 'text_config'")
    out = {**GEMMA3_DEFAULTS, **{k: v for k, v in text.items() if v is not None}, "model_type": "gemma3_text"}
    if out.get("attn_logit_softcapping") or out.get("use_bidirectional_attention"):
        key = "attn_logit_softcapping" if out.get("attn_logit_softcapping") else "use_bidirectional_attention"
        raise ModelLoadError(f"{path}: {key} {out[key]!r} is not implemented; this model cannot be loaded yet")
    rope = out.get("rope_parameters") or {}
    if "full_attention" in rope or "sliding_attention" in rope:  # transformers 5: one RoPE per layer type
        local = rope.get("sliding_attention") or {}
        if local.get("rope_type", "default") != "default":
            raise ModelLoadError(f"{path}: rope_parameters.sliding_attention of type {local['rope_type']!r} is not "
                                 "implemented (the local layers' RoPE is unscaled); this model cannot be loaded yet")
        out["rope_parameters"] = rope.get("full_attention") or {}
        out["rope_theta"] = out["rope_parameters"].get("rope_theta", out["rope_theta"])
        local_theta = float(local.get("rope_theta") or out["rope_local_base_freq"])
    else:
        out["rope_parameters"] = out.pop("rope_scaling", None) or {}
        local_theta = float(out["rope_local_base_freq"])
    if not out.get("layer_types"):
        pattern = int(out["sliding_window_pattern"])
        out["layer_types"] = ["sliding_attention" if (i + 1) % pattern else "full_attention"
                              for i in range(int(out["num_hidden_layers"]))]
    return out, local_theta


_ROPE_TYPES = (None, "default", "llama3", "linear", "yarn")
"""RoPE scalings the reference implements."""


def refuse_unimplemented(cfg: dict[str, Any], family: str, path: Path) -> None:
    """A one-line ModelLoadError naming the config key, for what would load but compute other logits than HF's: a
    RoPE scaling the reference does not implement, quantized weights, MLP biases."""
    rope = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
    kind = rope.get("rope_type", rope.get("type"))
    if kind not in _ROPE_TYPES:
        raise ModelLoadError(f"{path}: rope_scaling of type {kind!r} is not implemented (llama3, linear and yarn "
                             "are), and the logits would be wrong at every position; this model cannot be loaded yet")
    quant = cfg.get("quantization_config")
    if quant:
        method = quant.get("quant_method", "?") if isinstance(quant, dict) else quant
        raise ModelLoadError(f"{path}: quantization_config ({method}): quantized checkpoints are not read (their "
                             "weights would load as raw integers); use the unquantized model")
    if cfg.get("mlp_bias"):
        raise ModelLoadError(f"{path}: mlp_bias true: biases in the MLP are not implemented; this model cannot be "
                             "loaded yet")


def rope_scaling(rope: dict[str, Any], cfg: dict[str, Any], path: Path) -> RopeScaling | None:
    """The `rope_scaling` (or `rope_parameters`) of an HF config as a `RopeScaling` (None: plain RoPE)."""
    kind = rope.get("rope_type", rope.get("type"))
    if kind in (None, "default"):
        return None
    try:
        if kind == "llama3":
            return RopeScaling(factor=float(rope["factor"]), low_freq_factor=float(rope["low_freq_factor"]),
                               high_freq_factor=float(rope["high_freq_factor"]),
                               original_max_position_embeddings=int(rope["original_max_position_embeddings"]))
        if kind == "linear":
            return RopeScaling(factor=float(rope["factor"]), kind="linear")
        original = int(rope.get("original_max_position_embeddings") or cfg.get("max_position_embeddings", 4096))
        factor = float(rope.get("factor") or int(cfg["max_position_embeddings"]) / original)
    except KeyError as e:
        raise ModelLoadError(f"{path}: rope_scaling of type {kind!r} needs {e.args[0]!r}") from None
    mscale, mscale_all = rope.get("mscale"), rope.get("mscale_all_dim")
    attention = rope.get("attention_factor") or (
        yarn_mscale(factor, mscale) / yarn_mscale(factor, mscale_all) if mscale and mscale_all else yarn_mscale(factor))
    return RopeScaling(factor=factor, original_max_position_embeddings=original, kind="yarn",
                       beta_fast=float(rope.get("beta_fast") or 32), beta_slow=float(rope.get("beta_slow") or 1),
                       attention_factor=float(attention), truncate=bool(rope.get("truncate", True)))


def yarn_mscale(factor: float, mscale: float = 1.0) -> float:
    """YaRN's attention temperature for a context `factor` times longer: 0.1 mscale ln(factor) + 1."""
    return 0.1 * mscale * math.log(factor) + 1.0 if factor > 1 else 1.0


_LAYER_TYPES = {"full_attention": False, "sliding_attention": True}
_ACTIVATIONS: dict[str, Literal["silu", "gelu_tanh"]] = {"silu": "silu", "gelu_pytorch_tanh": "gelu_tanh",
                                                         "gelu_tanh": "gelu_tanh"}


def layer_windows(cfg: dict[str, Any], family: str, num_layers: int, path: Path) -> tuple[int, ...]:
    """Each layer's attention window as transformers computes it from a config (0: every key): `layer_types` where
    given; else Qwen's `use_sliding_window`, for the layers transformers' default `layer_types` names (from
    `max_window_layers` on; Qwen2-MoE's every other one below it; Qwen3-MoE's all); else (Mistral, Mixtral)
    `sliding_window` on every layer. A window that covers the whole context is none, except in Gemma, whose windowed
    layers also have a RoPE of their own."""
    window = cfg.get("sliding_window")
    if family.startswith("qwen") and not cfg.get("use_sliding_window", False):
        window = None
    if not window:
        return ()
    types = cfg.get("layer_types")
    if types is not None:
        if len(types) != num_layers or any(t not in _LAYER_TYPES for t in types):
            raise ModelLoadError(f"{path}: layer_types must list {num_layers} of {', '.join(_LAYER_TYPES)}")
        sliding = [_LAYER_TYPES[t] for t in types]
    elif family == "gpt_oss":  # transformers' default layer_types: windowed, full, windowed, ...
        sliding = [bool((i + 1) % 2) for i in range(num_layers)]
    elif family == "qwen3_moe":  # its attention reads sliding_window on every layer
        sliding = [True] * num_layers
    elif family.startswith("qwen"):  # transformers' default layer_types: Qwen2-MoE alternates below the bound
        first = int(cfg.get("max_window_layers", num_layers))
        sliding = [bool((i + 1) % 2) and i < first if family == "qwen2_moe" else i >= first for i in range(num_layers)]
    else:
        sliding = [True] * num_layers
    covers = int(window) >= int(cfg.get("max_position_embeddings", 4096)) and not family.startswith("gemma")
    if covers or not any(sliding):
        return ()
    return tuple(int(window) if s else 0 for s in sliding)


def dense_layers(cfg: dict[str, Any], num_layers: int) -> tuple[int, ...]:
    """The layers of a Qwen-MoE config whose MLP is dense, as transformers decides: those in `mlp_only_layers`, and
    those whose number (from 1) `decoder_sparse_step` does not divide."""
    step, only = int(cfg.get("decoder_sparse_step") or 1), set(cfg.get("mlp_only_layers") or ())
    first = int(cfg.get("first_k_dense_replace") or 0)  # DeepSeek's: its first layers are dense
    return tuple(i for i in range(num_layers) if i < first or i in only or (i + 1) % step)


def mla_fields(cfg: dict[str, Any], path: Path) -> tuple[MLASpec, int, float]:
    """A DeepSeek config's multi-head latent attention, its heads' key width, and its softmax scale (YaRN's
    `mscale_all_dim` folded in twice, as transformers does)."""
    if cfg.get("attention_bias"):
        raise ModelLoadError(f"{path}: attention_bias true: biases in multi-head latent attention are not "
                             "implemented; this model cannot be loaded yet")
    try:
        mla = MLASpec(kv_rank=int(cfg["kv_lora_rank"]), q_rank=int(cfg.get("q_lora_rank") or 0),
                      nope_dim=int(cfg["qk_nope_head_dim"]), rope_dim=int(cfg["qk_rope_head_dim"]),
                      v_dim=int(cfg["v_head_dim"]), interleave=bool(cfg.get("rope_interleave", True)))
    except KeyError as e:
        raise ModelLoadError(f"{path}: field {e.args[0]!r} is missing") from None
    head_dim = mla.nope_dim + mla.rope_dim
    rope = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
    scale = head_dim ** -0.5
    if rope.get("rope_type", rope.get("type", "default")) != "default" and rope.get("mscale_all_dim"):
        scale *= yarn_mscale(float(rope["factor"]), float(rope["mscale_all_dim"])) ** 2
    return mla, head_dim, scale


def spec_from_config(cfg: dict[str, Any], path: Path) -> ModelSpec:
    family = str(cfg.get("model_type", ""))
    local_theta = 0.0
    if family in ("gemma3", "gemma3_text"):
        cfg, local_theta = gemma3_text(cfg, path)
        family = "gemma3_text"
    if family not in ARCHITECTURES:
        raise ModelLoadError(f"{path}: model_type {family!r} is not supported; use one of {', '.join(ARCHITECTURES)}")

    def need(key: str) -> Any:
        if key not in cfg:
            raise ModelLoadError(f"{path}: field {key!r} is missing")
        return cfg[key]

    hidden, heads = int(need("hidden_size")), int(need("num_attention_heads"))
    refuse_unimplemented(cfg, family, path)
    gemma, gpt_oss = family == "gemma3_text", family == "gpt_oss"
    act_key = "hidden_activation" if cfg.get("hidden_activation") else "hidden_act"
    act = cfg.get(act_key) or ("gelu_pytorch_tanh" if gemma else "silu")
    if act not in _ACTIVATIONS:
        raise ModelLoadError(f"{path}: {act_key} {act!r} is not implemented (use one of {', '.join(_ACTIVATIONS)}); "
                             "this model cannot be loaded yet")
    rope = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
    scaling = rope_scaling(rope, cfg, path)
    moe = None
    num_experts = cfg.get("num_experts") or cfg.get("num_local_experts") or cfg.get("n_routed_experts")
    deepseek = family == "deepseek_v3"
    mla, head_dim, attn_scale = mla_fields(cfg, path) if deepseek else (None, 0, 0.0)
    if num_experts:
        shared = int(cfg.get("shared_expert_intermediate_size")
                     or int(cfg.get("n_shared_experts") or 0) * int(cfg.get("moe_intermediate_size") or 0))
        moe = MoESpec(
            num_experts=int(num_experts), top_k=int(need("num_experts_per_tok")),
            intermediate_size=int(cfg.get("moe_intermediate_size") or need("intermediate_size")),
            scoring="sigmoid" if cfg.get("scoring_func") == "sigmoid" or deepseek else "softmax",
            renormalize=bool(cfg.get("norm_topk_prob", family in ("mixtral", "gpt_oss"))),
            shared_intermediate_size=shared,
            shared_gate=shared > 0 and bool(cfg.get("shared_expert_gate", family == "qwen2_moe")),
            logit_bias=gpt_oss, expert_bias=gpt_oss, swiglu_limit=float(cfg.get("swiglu_limit") or 0.0) if gpt_oss else 0.0,
            swiglu_alpha=float(cfg.get("swiglu_alpha") or 1.702),
            num_groups=int(cfg.get("n_group") or 1) if deepseek else 1,
            top_groups=int(cfg.get("topk_group") or 1) if deepseek else 1,
            routed_scale=float(cfg.get("routed_scaling_factor") or 1.0) if deepseek else 1.0,
        )
    return ModelSpec(
        name=str(cfg.get("_name_or_path") or cfg.get("athanor_name") or path.parent.name),
        vocab_size=int(need("vocab_size")), hidden_size=hidden,
        intermediate_size=int(need("intermediate_size")), num_layers=int(need("num_hidden_layers")),
        num_heads=heads, num_kv_heads=int(cfg.get("num_key_value_heads") or heads),
        head_dim=head_dim or int(cfg.get("head_dim") or hidden // heads), mla=mla,
        rope_theta=float(cfg.get("rope_theta") or rope.get("rope_theta") or 10000.0), rope_scaling=scaling,
        rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
        max_position_embeddings=int(cfg.get("max_position_embeddings", 4096)),
        tie_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        qk_norm=bool(cfg.get("use_qk_norm", family in ("qwen3", "qwen3_moe", "gemma3_text"))),
        attn_bias=bool(cfg.get("qkv_bias" if family == "qwen2_moe" else "attention_bias",
                               family in _QKV_BIASED or gpt_oss)),
        out_bias=family not in _QKV_BIASED and bool(cfg.get("attention_bias", gpt_oss)), attn_sinks=gpt_oss,
        moe=moe, family=family, layer_windows=layer_windows(cfg, family, int(need("num_hidden_layers")), path),
        dense_layers=dense_layers(cfg, int(need("num_hidden_layers"))) if moe else (),
        local_rope_theta=local_theta, norm_unit_offset=gemma, sandwich_norms=gemma,
        embed_scale=hidden ** 0.5 if gemma else 1.0, activation=_ACTIVATIONS[act],
        attn_scale=float(cfg["query_pre_attn_scalar"]) ** -0.5 if gemma else attn_scale,
        final_logit_softcap=float(cfg.get("final_logit_softcapping") or 0.0),
    )



_QKV_BIASED = ("qwen2", "qwen2_moe")
"""The families whose HF classes put biases on q, k and v only (Qwen2's always, Qwen2-MoE's as `qkv_bias` says);
the others' `attention_bias` puts one on the output projection too."""
_QK_NORM_FAMILIES = ("qwen3", "qwen3_moe", "gemma3_text")
"""The families whose HF classes norm q and k (always: the config has no switch for it)."""


def hf_config(spec: ModelSpec, dtype: torch.dtype, hf_exact: bool = True) -> dict[str, Any]:
    """The config.json HF builds `spec`'s function from. `hf_exact`: a ConfigError for a spec no HF class computes, as
    HF would load its directory into another function without a word (dropping the tensors it has no place for);
    False: write it anyway, for a directory only athanor reads (which reads it whole)."""
    family = spec.family if spec.family in ARCHITECTURES else "llama"
    lacks = ""
    if spec.mla:
        raise ConfigError(f"{spec.name}: writing a multi-head latent attention config for HF is not implemented; "
                          "use the preset itself (random weights in memory) rather than a saved directory")
    if spec.qk_norm != (family in _QK_NORM_FAMILIES):
        lacks = f"{'has no' if spec.qk_norm else 'always has'} q/k norms"
    elif spec.dense_layers and family not in ("qwen2_moe", "qwen3_moe"):
        lacks = "has no dense layers among MoE ones"
    elif spec.moe and spec.moe.shared_intermediate_size and family != "qwen2_moe":
        lacks = "has no shared expert (qwen2_moe has one)"
    if hf_exact and lacks:
        raise ConfigError(f"{spec.name}: HF's {family} {lacks}, so no HF class computes this spec; it cannot be saved "
                          "for HF")
    cfg: dict[str, Any] = {
        "architectures": [ARCHITECTURES[family]], "model_type": family, "athanor_name": spec.name,
        "vocab_size": spec.vocab_size, "hidden_size": spec.hidden_size,
        "intermediate_size": spec.intermediate_size, "num_hidden_layers": spec.num_layers,
        "num_attention_heads": spec.num_heads, "num_key_value_heads": spec.num_kv_heads,
        "head_dim": spec.head_dim, "rope_theta": spec.rope_theta, "rms_norm_eps": spec.rms_norm_eps,
        "max_position_embeddings": spec.max_position_embeddings, "tie_word_embeddings": spec.tie_embeddings,
        "attention_bias": spec.attn_bias if family in _QKV_BIASED else spec.attn_bias or spec.out_bias,
        "qkv_bias": spec.attn_bias, "hidden_act": "silu" if spec.activation == "silu" else "gelu_pytorch_tanh",
        # Not read by HF for these families; written so that a round trip is exact.
        "use_qk_norm": spec.qk_norm,
        "torch_dtype": str(dtype).removeprefix("torch."),
    }
    if spec.rope_scaling:
        s = spec.rope_scaling
        cfg["rope_scaling"] = {
            "llama3": {"rope_type": "llama3", "factor": s.factor, "low_freq_factor": s.low_freq_factor,
                       "high_freq_factor": s.high_freq_factor,
                       "original_max_position_embeddings": s.original_max_position_embeddings},
            "linear": {"rope_type": "linear", "factor": s.factor},
            "yarn": {"rope_type": "yarn", "factor": s.factor, "beta_fast": s.beta_fast, "beta_slow": s.beta_slow,
                     "attention_factor": s.attention_factor, "truncate": s.truncate,
                     "original_max_position_embeddings": s.original_max_position_embeddings},
        }[s.kind]
    if spec.layer_windows:
        cfg.update({"sliding_window": max(spec.layer_windows), "use_sliding_window": True, "max_window_layers": 0,
                    "layer_types": ["sliding_attention" if spec.window(i) else "full_attention"
                                    for i in range(spec.num_layers)]})
    if family == "gemma3_text":
        cfg.update(_gemma3_fields(spec))
    if family == "gpt_oss":  # transformers 5 reads its RoPE from rope_parameters only
        cfg["rope_parameters"] = {**cfg.pop("rope_scaling", {"rope_type": "default"}), "rope_theta": spec.rope_theta}
    if spec.moe:
        m = spec.moe
        key = "num_local_experts" if family in ("mixtral", "gpt_oss") else "num_experts"
        cfg.update({key: m.num_experts, "num_experts_per_tok": m.top_k, "moe_intermediate_size": m.intermediate_size,
                    "norm_topk_prob": m.renormalize, "shared_expert_intermediate_size": m.shared_intermediate_size,
                    "decoder_sparse_step": 1, "mlp_only_layers": list(spec.dense_layers),
                    "shared_expert_gate": m.shared_gate})
        if family in ("mixtral", "gpt_oss"):  # its experts are `intermediate_size` wide: it has no other MLP
            cfg["intermediate_size"] = m.intermediate_size
        if m.swiglu_limit:
            cfg.update({"swiglu_limit": m.swiglu_limit, "swiglu_alpha": m.swiglu_alpha})
        if m.scoring == "sigmoid":
            cfg["scoring_func"] = "sigmoid"
    return cfg


def _gemma3_fields(spec: ModelSpec) -> dict[str, Any]:
    """A Gemma 3 text config's own fields, in transformers 5's spelling (one RoPE per layer type)."""
    full = {"rope_type": "default", "rope_theta": spec.rope_theta}
    if spec.rope_scaling:
        full = {"rope_type": "linear", "factor": spec.rope_scaling.factor, "rope_theta": spec.rope_theta}
    return {"hidden_activation": "gelu_pytorch_tanh" if spec.activation == "gelu_tanh" else spec.activation,
            "query_pre_attn_scalar": round(spec.softmax_scale ** -2), "sliding_window": max(spec.layer_windows),
            "layer_types": ["sliding_attention" if spec.window(i) else "full_attention" for i in range(spec.num_layers)],
            "rope_parameters": {"full_attention": full,
                                "sliding_attention": {"rope_type": "default", "rope_theta": spec.local_rope_theta}},
            "final_logit_softcapping": spec.final_logit_softcap or None, "attn_logit_softcapping": None}
