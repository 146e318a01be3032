"""HF model directories: `config.json` (`athanor.model.hf_config`) + safetensors (one file or sharded with an index),
both ways.

Reading maps HF tensor names (Llama, Qwen2/3, Mistral, Mixtral, Qwen2/3-MoE, Gemma 3's text model, alone or
inside its multimodal checkpoint) to athanor's canonical names; per-expert MoE tensors are stacked into [E, ...].
Writing does the reverse, so `athanor save-random` produces a directory that HF transformers can load too.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import re
from pathlib import Path
from typing import Any

import torch

from athanor.errors import ModelLoadError
from athanor.model.hf_config import hf_config, read_config
from athanor.model.model import Model
from athanor.model.shard import shard_cuts, shard_model
from athanor.model.spec import ModelSpec
from athanor.model.tokenizer import Tokenizer, tokenizer_from_hf_dir

_ATTN = {"input_layernorm.weight": "attn_norm", "post_attention_layernorm.weight": "mlp_norm",
         "self_attn.q_proj.weight": "wq", "self_attn.k_proj.weight": "wk", "self_attn.v_proj.weight": "wv",
         "self_attn.o_proj.weight": "wo", "self_attn.q_proj.bias": "bq", "self_attn.k_proj.bias": "bk",
         "self_attn.v_proj.bias": "bv", "self_attn.o_proj.bias": "bo", "self_attn.q_norm.weight": "q_norm", "self_attn.k_norm.weight": "k_norm",
         "mlp.gate_proj.weight": "w_gate", "mlp.up_proj.weight": "w_up", "mlp.down_proj.weight": "w_down",
         "mlp.gate.weight": "router", "block_sparse_moe.gate.weight": "router", "mlp.router_bias": "router_bias",
         "mlp.shared_expert.gate_proj.weight": "shared.w_gate", "mlp.shared_expert.up_proj.weight": "shared.w_up",
         "mlp.shared_expert.down_proj.weight": "shared.w_down", "mlp.shared_expert_gate.weight": "shared.gate"}
_EXPERT = re.compile(r"^(?:mlp|block_sparse_moe)\.experts\.(\d+)\.(\w+)\.weight$")
_EXPERT_PROJ = {"gate_proj": "w_gate", "up_proj": "w_up", "down_proj": "w_down", "w1": "w_gate", "w3": "w_up", "w2": "w_down"}
_TOP = {"model.embed_tokens.weight": "embed", "model.norm.weight": "norm", "lm_head.weight": "lm_head"}
_GEMMA_NORMS = {"post_attention_layernorm.weight": "attn_post_norm", "pre_feedforward_layernorm.weight": "mlp_norm",
                "post_feedforward_layernorm.weight": "mlp_post_norm"}
"""Gemma's four norms a layer: its `post_attention_layernorm` is on attention's output, not the MLP's input."""
_MULTIMODAL_TEXT = (("model.language_model.", "model."), ("language_model.model.", "model."),
                    ("language_model.lm_head.", "lm_head."))
"""Where a multimodal checkpoint (Gemma 3's `gemma3`) keeps its text model's tensors, in transformers 5's naming and
the one before; its vision tower and projector are not read."""
_VISION = ("model.vision_tower.", "model.multi_modal_projector.", "vision_tower.", "multi_modal_projector.")


_GPT_OSS = {"self_attn.sinks": "sinks", "mlp.router.weight": "router", "mlp.router.bias": "router_logit_bias"}
_PACKED = re.compile(r"^mlp\.experts\.(gate_up_proj|gate_up_proj_bias|down_proj|down_proj_bias)$")
"""gpt-oss keeps each layer's experts as four tensors: gate and up interleaved by column, [E, H, 2I] and [E, 2I], and
the down projection transposed, [E, I, H] and its bias [E, H]."""


_DEEPSEEK = {"self_attn.q_a_proj.weight": "q_a", "self_attn.q_a_layernorm.weight": "q_a_norm",
             "self_attn.q_b_proj.weight": "q_b", "self_attn.kv_a_proj_with_mqa.weight": "kv_a",
             "self_attn.kv_a_layernorm.weight": "kv_a_norm", "self_attn.kv_b_proj.weight": "kv_b",
             "mlp.gate.e_score_correction_bias": "router_bias", "mlp.shared_experts.gate_proj.weight": "shared.w_gate",
             "mlp.shared_experts.up_proj.weight": "shared.w_up", "mlp.shared_experts.down_proj.weight": "shared.w_down"}
"""DeepSeek's multi-head latent attention, its router's choice-only bias and its shared experts (plural)."""


@functools.cache
def _layer_names(family: str) -> dict[str, str]:
    """A family's per-layer HF names and their canonical ones (read-only: shared between calls)."""
    if family == "gpt_oss":
        return {**_ATTN, **_GPT_OSS}
    if family == "deepseek_v3":
        return {**_ATTN, **_DEEPSEEK}
    return {**_ATTN, **_GEMMA_NORMS} if family.startswith("gemma") else _ATTN


def _unpack_experts(weights: dict[str, torch.Tensor], num_layers: int) -> None:
    """gpt-oss's packed experts (`_PACKED`) as athanor's [E, I, H] / [E, H, I] projections and their biases."""
    for layer in range(num_layers):
        names = [f"layers.{layer}.experts.packed.{k}" for k in
                 ("gate_up_proj", "gate_up_proj_bias", "down_proj", "down_proj_bias")]
        if not all(n in weights for n in names):
            continue  # Model.validate names what is missing
        gate_up, gate_up_bias, down, down_bias = (weights.pop(n) for n in names)
        weights.update({f"layers.{layer}.experts.{k}": t.contiguous() for k, t in (
            ("w_gate", gate_up[..., ::2].transpose(1, 2)), ("w_up", gate_up[..., 1::2].transpose(1, 2)),
            ("w_down", down.transpose(1, 2)), ("b_gate", gate_up_bias[:, ::2]), ("b_up", gate_up_bias[:, 1::2]),
            ("b_down", down_bias))})


def _packed_experts(model: Model, layer: int) -> dict[str, torch.Tensor]:
    """`_unpack_experts` undone for one layer: its experts under gpt-oss's names."""
    get = model.layer
    w_gate, w_up = get(layer, "experts.w_gate"), get(layer, "experts.w_up")
    e, i, h = w_gate.shape
    gate_up, gate_up_bias = w_gate.new_empty(e, h, 2 * i), w_gate.new_empty(e, 2 * i)
    gate_up[..., ::2], gate_up[..., 1::2] = w_gate.transpose(1, 2), w_up.transpose(1, 2)
    gate_up_bias[:, ::2], gate_up_bias[:, 1::2] = get(layer, "experts.b_gate"), get(layer, "experts.b_up")
    prefix = f"model.layers.{layer}.mlp.experts."
    return {prefix + "gate_up_proj": gate_up, prefix + "gate_up_proj_bias": gate_up_bias,
            prefix + "down_proj": get(layer, "experts.w_down").transpose(1, 2).contiguous(),
            prefix + "down_proj_bias": get(layer, "experts.b_down")}


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
    directory: str | Path, dtype: torch.dtype | None = None, device: torch.device | str = "cpu",
    shard: tuple[int, int, int] | None = None,
) -> tuple[Model, Tokenizer | None]:
    """The model (and its tokenizer, when the directory has one) in an HF model directory. `shard` (rank, tp, ep): only
    that rank's share (`athanor.model.shard.shard_cuts`), each cut tensor read as its slice of the file, never
    whole (gpt-oss's packed experts excepted: read whole, then cut)."""
    from safetensors import SafetensorError, safe_open

    directory = Path(directory)
    if not directory.is_dir():
        raise ModelLoadError(f"{directory}: no such model directory")
    full_spec, file_dtype = read_config(directory)
    spec, cut, kept = _shard_plan(full_spec, shard)
    dtype = dtype or file_dtype
    weights: dict[str, torch.Tensor] = {}
    experts: dict[str, dict[int, torch.Tensor]] = {}
    for file in _safetensors_files(directory):
        if not file.is_file():
            raise ModelLoadError(f"{file}: missing (listed in the safetensors index)")
        try:
            # A shard's slices are cut from the memory-mapped file on the host and copied to the device alone.
            with safe_open(str(file), framework="pt", device="cpu" if cut else str(device)) as f:
                for hf_name in f.keys():  # noqa: SIM118 (safe_open is not a dict)
                    if hf_name.startswith(_VISION):
                        continue
                    name, expert = _canonical(hf_name, file, spec.family)
                    if expert is not None and not kept.start <= expert < kept.stop:
                        continue  # another EP rank's
                    part = cut.get(name.split(".", 2)[2] if name.startswith("layers.") else name)
                    if part is not None and expert is not None:  # one expert of the stacked [E, ...] cut:
                        part = (part[0] - 1, part[1]) if part[0] else None  # its own dims, or EP's block (`kept`)
                    tensor = _read(f, hf_name, part, device, dtype)
                    if expert is None:
                        weights[name] = tensor
                    else:
                        experts.setdefault(name, {})[expert] = tensor
        except (SafetensorError, OSError) as e:
            raise ModelLoadError(f"{file}: corrupt or unreadable safetensors file ({e})") from None
    for name, by_index in experts.items():
        first = min(by_index)
        if sorted(by_index) != list(range(first, first + len(by_index))):
            raise ModelLoadError(f"{directory}: experts of {name!r} are not numbered {first}..{first + len(by_index) - 1}")
        weights[name] = torch.stack([by_index[e] for e in range(first, first + len(by_index))])
    if spec.family == "gpt_oss":
        _unpack_experts(weights, spec.num_layers)
        if shard is not None:  # packed in the file: cut now, and copied so the whole does not stay behind
            cut_model = shard_model(Model(full_spec, weights), *shard)
            spec = cut_model.spec
            weights = {n: t.clone() if t.untyped_storage().nbytes() > t.nbytes else t
                       for n, t in cut_model.weights.items()}
    if spec.out_bias and "layers.0.bo" not in weights:
        # HF starts an output bias its checkpoint lacks at zero: the same function as none (how athanor writes a
        # spec with q/k/v biases only, as tiny-qwen, for a family whose attention_bias means all four).
        spec = dataclasses.replace(spec, out_bias=False)
    model = Model(spec, weights, source=str(directory))
    model.validate(str(directory), experts_held=kept.stop - kept.start)
    return model, tokenizer_from_hf_dir(directory)


def _shard_plan(spec: ModelSpec, shard: tuple[int, int, int] | None
                ) -> tuple[ModelSpec, dict[str, tuple[int, slice]], slice]:
    """The spec a load gives, the cuts it reads (`shard_cuts`'s; none for gpt-oss, cut after unpacking) and the
    experts it keeps."""
    num_experts = spec.moe.num_experts if spec.moe else 0
    if shard is None:
        return spec, {}, slice(0, num_experts)
    rank, tp, ep = shard
    mine, cut = shard_cuts(spec, rank, tp, ep)
    held = num_experts // ep
    experts = slice((rank % ep) * held, (rank % ep + 1) * held)
    if spec.family == "gpt_oss":  # its experts are packed: read whole, cut after unpacking
        return spec, {}, experts
    return mine, cut, experts


def _read(f: Any, hf_name: str, part: tuple[int, slice] | None, device: torch.device | str,
          dtype: torch.dtype) -> torch.Tensor:
    """A tensor of an open safetensors file, or only `part` (dimension, slice) of it, in its own memory: a slice is a
    view of the whole tensor's mapped bytes until copied."""
    if part is None:
        return f.get_tensor(hf_name).to(device=device, dtype=dtype)
    dim, keep = part
    tensor = f.get_slice(hf_name)[(slice(None),) * dim + (keep,)].to(device=device, dtype=dtype)
    return tensor.clone() if tensor.untyped_storage().nbytes() > tensor.nbytes else tensor


def _canonical(hf_name: str, file: Path, family: str) -> tuple[str, int | None]:
    for prefix, short in _MULTIMODAL_TEXT:
        if hf_name.startswith(prefix):
            hf_name = short + hf_name.removeprefix(prefix)
    if hf_name in _TOP:
        return _TOP[hf_name], None
    m = re.match(r"^model\.layers\.(\d+)\.(.+)$", hf_name)
    layer_names = _layer_names(family)
    if m:
        layer, rest = m.group(1), m.group(2)
        if rest in layer_names:
            return f"layers.{layer}.{layer_names[rest]}", None
        packed = _PACKED.match(rest) if family == "gpt_oss" else None
        if packed:
            return f"layers.{layer}.experts.packed.{packed.group(1)}", None
        e = _EXPERT.match(rest)
        if e and e.group(2) in _EXPERT_PROJ:
            return f"layers.{layer}.experts.{_EXPERT_PROJ[e.group(2)]}", int(e.group(1))
    raise ModelLoadError(f"{file}: unknown tensor {hf_name!r} for athanor's model families")


# -- writing -------------------------------------------------------------------------------------
def _hf_tensors(model: Model) -> dict[str, torch.Tensor]:
    family = model.spec.family
    top = {v: k for k, v in _TOP.items()}
    attn = {v: k for k, v in _layer_names(family).items() if not k.startswith("block_sparse_moe")}
    if family == "mixtral":
        attn["router"] = "block_sparse_moe.gate.weight"
    out: dict[str, torch.Tensor] = {}
    for name, t in model.weights.items():
        if name in top:
            out[top[name]] = t
            continue
        _, layer, rest = name.split(".", 2)
        if rest.startswith("experts.") and family == "gpt_oss":
            if rest == "experts.w_gate":
                out.update(_packed_experts(model, int(layer)))
        elif rest.startswith("experts."):
            proj = rest.split(".")[1]
            hf_proj = {"w_gate": "w1", "w_up": "w3", "w_down": "w2"}[proj] if family == "mixtral" else \
                {"w_gate": "gate_proj", "w_up": "up_proj", "w_down": "down_proj"}[proj]
            block = "block_sparse_moe" if family == "mixtral" else "mlp"
            for e in range(t.shape[0]):
                out[f"model.layers.{layer}.{block}.experts.{e}.{hf_proj}.weight"] = t[e]
        else:
            out[f"model.layers.{layer}.{attn[rest]}"] = t
    return out


def save_hf(model: Model, directory: str | Path, shard_bytes: int = 4 << 30, tokenizer: Tokenizer | None = None,
            hf_exact: bool = True) -> Path:
    """Write `model` as an HF directory (config.json + sharded safetensors [+ tokenizer]); `hf_exact`: as
    `hf_config`'s (False for a directory only athanor reads)."""
    from safetensors.torch import save_file

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(hf_config(model.spec, model.dtype, hf_exact), indent=2) + "\n")
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
