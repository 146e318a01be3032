"""HF model directories: `config.json` + safetensors (one file or sharded with an index), both ways.

Reading maps HF tensor names (Llama, Qwen2/3, Mistral, Mixtral, Qwen2/3-MoE) to athanor's
canonical names; per-expert MoE tensors are stacked into [E, ...]. Writing does the reverse,
so `athanor save-random` produces a directory that HF transformers can load too.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

import torch

from athanor.errors import ModelLoadError
from athanor.model.model import Model
from athanor.model.spec import ModelSpec, MoESpec, RopeScaling
from athanor.model.tokenizer import Tokenizer, tokenizer_from_hf_dir

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
_ARCHITECTURES = {
    "llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM", "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM", "mixtral": "MixtralForCausalLM", "qwen3_moe": "Qwen3MoeForCausalLM",
    "qwen2_moe": "Qwen2MoeForCausalLM",
}
_ATTN = {"input_layernorm.weight": "attn_norm", "post_attention_layernorm.weight": "mlp_norm",
         "self_attn.q_proj.weight": "wq", "self_attn.k_proj.weight": "wk", "self_attn.v_proj.weight": "wv",
         "self_attn.o_proj.weight": "wo", "self_attn.q_proj.bias": "bq", "self_attn.k_proj.bias": "bk",
         "self_attn.v_proj.bias": "bv", "self_attn.q_norm.weight": "q_norm", "self_attn.k_norm.weight": "k_norm",
         "mlp.gate_proj.weight": "w_gate", "mlp.up_proj.weight": "w_up", "mlp.down_proj.weight": "w_down",
         "mlp.gate.weight": "router", "block_sparse_moe.gate.weight": "router", "mlp.router_bias": "router_bias",
         "mlp.shared_expert.gate_proj.weight": "shared.w_gate", "mlp.shared_expert.up_proj.weight": "shared.w_up",
         "mlp.shared_expert.down_proj.weight": "shared.w_down", "mlp.shared_expert_gate.weight": "shared.gate"}
_EXPERT = re.compile(r"^(?:mlp|block_sparse_moe)\.experts\.(\d+)\.(\w+)\.weight$")
_EXPERT_PROJ = {"gate_proj": "w_gate", "up_proj": "w_up", "down_proj": "w_down", "w1": "w_gate", "w3": "w_up", "w2": "w_down"}
_TOP = {"model.embed_tokens.weight": "embed", "model.norm.weight": "norm", "lm_head.weight": "lm_head"}


# -- reading -------------------------------------------------------------------------------------
def read_config(directory: Path) -> tuple[ModelSpec, torch.dtype]:
    path = directory / "config.json"
    try:
        cfg = json.loads(path.read_text())
    except FileNotFoundError:
        raise ModelLoadError(f"{path}: missing; an HF model directory needs config.json") from None
    except json.JSONDecodeError as e:
        raise ModelLoadError(f"{path}: not valid JSON ({e.msg} at line {e.lineno})") from None
    return spec_from_config(cfg, path), _DTYPES.get(str(cfg.get("torch_dtype") or cfg.get("dtype")), torch.float32)


_ROPE_TYPES = (None, "default", "llama3", "linear", "yarn")
"""RoPE scalings the reference implements."""


def refuse_unimplemented(cfg: dict[str, Any], family: str, path: Path) -> None:
    """A one-line ModelLoadError naming the config key, for what would load but compute other logits than HF's: a
    RoPE scaling the reference does not implement, MoE layers interleaved with dense ones."""
    rope = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
    kind = rope.get("rope_type", rope.get("type"))
    if kind not in _ROPE_TYPES:
        raise ModelLoadError(f"{path}: rope_scaling of type {kind!r} is not implemented (llama3, linear and yarn "
                             "are), and the logits would be wrong at every position; this model cannot be loaded yet")
    if int(cfg.get("decoder_sparse_step") or 1) != 1 or cfg.get("mlp_only_layers"):
        raise ModelLoadError(f"{path}: decoder_sparse_step {cfg.get('decoder_sparse_step')} / mlp_only_layers "
                             f"{cfg.get('mlp_only_layers')}: MoE layers interleaved with dense ones are not "
                             "implemented (every layer must be MoE); this model cannot be loaded yet")


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


def layer_windows(cfg: dict[str, Any], family: str, num_layers: int, path: Path) -> tuple[int, ...]:
    """Each layer's attention window as transformers computes it from a config (0: every key): `layer_types` where
    given; else Qwen's `use_sliding_window` for the layers from `max_window_layers` on; else (Mistral, Mixtral)
    `sliding_window` on every layer. A window that covers the whole context is none."""
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
    elif family.startswith("qwen"):
        first = int(cfg.get("max_window_layers", num_layers))
        sliding = [i >= first for i in range(num_layers)]
    else:
        sliding = [True] * num_layers
    if int(window) >= int(cfg.get("max_position_embeddings", 4096)) or not any(sliding):
        return ()
    return tuple(int(window) if s else 0 for s in sliding)


def spec_from_config(cfg: dict[str, Any], path: Path) -> ModelSpec:
    family = str(cfg.get("model_type", ""))
    if family not in _ARCHITECTURES:
        raise ModelLoadError(f"{path}: model_type {family!r} is not supported; use one of {', '.join(_ARCHITECTURES)}")

    def need(key: str) -> Any:
        if key not in cfg:
            raise ModelLoadError(f"{path}: field {key!r} is missing")
        return cfg[key]

    hidden, heads = int(need("hidden_size")), int(need("num_attention_heads"))
    refuse_unimplemented(cfg, family, path)
    rope = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
    scaling = rope_scaling(rope, cfg, path)
    moe = None
    num_experts = cfg.get("num_experts") or cfg.get("num_local_experts")
    if num_experts:
        shared = int(cfg.get("shared_expert_intermediate_size") or 0)
        moe = MoESpec(
            num_experts=int(num_experts), top_k=int(need("num_experts_per_tok")),
            intermediate_size=int(cfg.get("moe_intermediate_size") or need("intermediate_size")),
            scoring="sigmoid" if cfg.get("scoring_func") == "sigmoid" else "softmax",
            renormalize=bool(cfg.get("norm_topk_prob", family == "mixtral")),
            shared_intermediate_size=shared,
            shared_gate=shared > 0 and bool(cfg.get("shared_expert_gate", family == "qwen2_moe")),
        )
    return ModelSpec(
        name=str(cfg.get("_name_or_path") or cfg.get("athanor_name") or path.parent.name),
        vocab_size=int(need("vocab_size")), hidden_size=hidden,
        intermediate_size=int(need("intermediate_size")), num_layers=int(need("num_hidden_layers")),
        num_heads=heads, num_kv_heads=int(cfg.get("num_key_value_heads") or heads),
        head_dim=int(cfg.get("head_dim") or hidden // heads),
        rope_theta=float(cfg.get("rope_theta") or rope.get("rope_theta") or 10000.0), rope_scaling=scaling,
        rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
        max_position_embeddings=int(cfg.get("max_position_embeddings", 4096)),
        tie_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        qk_norm=bool(cfg.get("use_qk_norm", family in ("qwen3", "qwen3_moe"))),
        attn_bias=bool(cfg.get("attention_bias", family in ("qwen2", "qwen2_moe"))),
        moe=moe, family=family, layer_windows=layer_windows(cfg, family, int(need("num_hidden_layers")), path),
    )


def _safetensors_files(directory: Path) -> list[Path]:
    index = directory / "model.safetensors.index.json"
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (json.JSONDecodeError, KeyError):
            raise ModelLoadError(f"{index}: not a valid safetensors index (needs a 'weight_map')") from None
        return [directory / f for f in sorted(set(weight_map.values()))]
    single = directory / "model.safetensors"
    if single.is_file():
        return [single]
    raise ModelLoadError(f"{directory}: no model.safetensors or model.safetensors.index.json")


def read_hf_dir(
    directory: str | Path, dtype: torch.dtype | None = None, device: torch.device | str = "cpu"
) -> tuple[Model, Tokenizer | None]:
    """The model (and its tokenizer, when the directory has one) in an HF model directory."""
    from safetensors import SafetensorError, safe_open

    directory = Path(directory)
    if not directory.is_dir():
        raise ModelLoadError(f"{directory}: no such model directory")
    spec, file_dtype = read_config(directory)
    dtype = dtype or file_dtype
    weights: dict[str, torch.Tensor] = {}
    experts: dict[str, dict[int, torch.Tensor]] = {}
    for file in _safetensors_files(directory):
        if not file.is_file():
            raise ModelLoadError(f"{file}: missing (listed in the safetensors index)")
        try:
            with safe_open(str(file), framework="pt", device=str(device)) as f:
                for hf_name in f.keys():  # noqa: SIM118 (safe_open is not a dict)
                    name, expert = _canonical(hf_name, file)
                    tensor = f.get_tensor(hf_name).to(dtype)
                    if expert is None:
                        weights[name] = tensor
                    else:
                        experts.setdefault(name, {})[expert] = tensor
        except (SafetensorError, OSError) as e:
            raise ModelLoadError(f"{file}: corrupt or unreadable safetensors file ({e})") from None
    for name, by_index in experts.items():
        if sorted(by_index) != list(range(len(by_index))):
            raise ModelLoadError(f"{directory}: experts of {name!r} are not numbered 0..{len(by_index) - 1}")
        weights[name] = torch.stack([by_index[e] for e in range(len(by_index))])
    model = Model(spec, weights, source=str(directory))
    model.validate(str(directory))
    return model, tokenizer_from_hf_dir(directory)


def _canonical(hf_name: str, file: Path) -> tuple[str, int | None]:
    if hf_name in _TOP:
        return _TOP[hf_name], None
    m = re.match(r"^model\.layers\.(\d+)\.(.+)$", hf_name)
    if m:
        layer, rest = m.group(1), m.group(2)
        if rest in _ATTN:
            return f"layers.{layer}.{_ATTN[rest]}", None
        e = _EXPERT.match(rest)
        if e and e.group(2) in _EXPERT_PROJ:
            return f"layers.{layer}.experts.{_EXPERT_PROJ[e.group(2)]}", int(e.group(1))
    raise ModelLoadError(f"{file}: unknown tensor {hf_name!r} for athanor's model families")


# -- writing -------------------------------------------------------------------------------------
def hf_config(spec: ModelSpec, dtype: torch.dtype) -> dict[str, Any]:
    family = spec.family if spec.family in _ARCHITECTURES else "llama"
    cfg: dict[str, Any] = {
        "architectures": [_ARCHITECTURES[family]], "model_type": family, "athanor_name": spec.name,
        "vocab_size": spec.vocab_size, "hidden_size": spec.hidden_size,
        "intermediate_size": spec.intermediate_size, "num_hidden_layers": spec.num_layers,
        "num_attention_heads": spec.num_heads, "num_key_value_heads": spec.num_kv_heads,
        "head_dim": spec.head_dim, "rope_theta": spec.rope_theta, "rms_norm_eps": spec.rms_norm_eps,
        "max_position_embeddings": spec.max_position_embeddings, "tie_word_embeddings": spec.tie_embeddings,
        "attention_bias": spec.attn_bias, "hidden_act": "silu",
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
    if spec.moe:
        m = spec.moe
        key = "num_local_experts" if family == "mixtral" else "num_experts"
        cfg.update({key: m.num_experts, "num_experts_per_tok": m.top_k, "moe_intermediate_size": m.intermediate_size,
                    "norm_topk_prob": m.renormalize, "shared_expert_intermediate_size": m.shared_intermediate_size,
                    "decoder_sparse_step": 1, "mlp_only_layers": [],
                    "shared_expert_gate": m.shared_gate})
        if m.scoring == "sigmoid":
            cfg["scoring_func"] = "sigmoid"
    return cfg


def _hf_tensors(model: Model) -> dict[str, torch.Tensor]:
    family = model.spec.family
    top = {v: k for k, v in _TOP.items()}
    attn = {v: k for k, v in _ATTN.items() if not k.startswith("block_sparse_moe")}
    if family == "mixtral":
        attn["router"] = "block_sparse_moe.gate.weight"
    out: dict[str, torch.Tensor] = {}
    for name, t in model.weights.items():
        if name in top:
            out[top[name]] = t
            continue
        _, layer, rest = name.split(".", 2)
        if rest.startswith("experts."):
            proj = rest.split(".")[1]
            hf_proj = {"w_gate": "w1", "w_up": "w3", "w_down": "w2"}[proj] if family == "mixtral" else \
                {"w_gate": "gate_proj", "w_up": "up_proj", "w_down": "down_proj"}[proj]
            block = "block_sparse_moe" if family == "mixtral" else "mlp"
            for e in range(t.shape[0]):
                out[f"model.layers.{layer}.{block}.experts.{e}.{hf_proj}.weight"] = t[e]
        else:
            out[f"model.layers.{layer}.{attn[rest]}"] = t
    return out


def save_hf(model: Model, directory: str | Path, shard_bytes: int = 4 << 30, tokenizer: Tokenizer | None = None) -> Path:
    """Write `model` as an HF directory (config.json + sharded safetensors [+ tokenizer])."""
    from safetensors.torch import save_file

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(hf_config(model.spec, model.dtype), indent=2) + "\n")
    tensors = {n: t.detach().contiguous().cpu() for n, t in _hf_tensors(model).items()}
    shards: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for name, t in tensors.items():
        nbytes = t.numel() * t.element_size()
        if shards[-1] and size + nbytes > shard_bytes:
            shards.append({})
            size = 0
        shards[-1][name] = t
        size += nbytes
    if len(shards) == 1:
        save_file(shards[0], str(directory / "model.safetensors"), metadata={"format": "pt"})
    else:
        weight_map = {}
        for i, shard in enumerate(shards):
            file = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
            save_file(shard, str(directory / file), metadata={"format": "pt"})
            weight_map.update(dict.fromkeys(shard, file))
        index = {"metadata": {"total_size": model.nbytes()}, "weight_map": weight_map}
        (directory / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
    if tokenizer is not None:
        tokenizer.save_hf(directory)
    return directory
