"""Load a GGUF file: metadata -> `ModelSpec`, tensors dequantized to float -> `Model`, and the tokenizer.

llama.cpp's converter permutes the rows of q and k for LLaMA-architecture files (its RoPE
rotates interleaved pairs); athanor's canonical layout is HF's (rotate halves), so those rows
are permuted back here.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np
import torch

from athanor.errors import ModelLoadError
from athanor.model.model import Model
from athanor.model.spec import ModelSpec, MoESpec, RopeScaling
from athanor.model.tokenizer import Tokenizer, tokenizer_from_gguf_fields

_LAYER = re.compile(r"^blk\.(\d+)\.(.+)$")
_LAYER_NAMES = {
    "attn_norm.weight": "attn_norm", "attn_q.weight": "wq", "attn_k.weight": "wk", "attn_v.weight": "wv",
    "attn_output.weight": "wo", "attn_q.bias": "bq", "attn_k.bias": "bk", "attn_v.bias": "bv",
    "attn_q_norm.weight": "q_norm", "attn_k_norm.weight": "k_norm", "ffn_norm.weight": "mlp_norm",
    "ffn_gate.weight": "w_gate", "ffn_up.weight": "w_up", "ffn_down.weight": "w_down",
    "ffn_gate_inp.weight": "router", "ffn_gate_exps.weight": "experts.w_gate",
    "ffn_up_exps.weight": "experts.w_up", "ffn_down_exps.weight": "experts.w_down",
    "ffn_gate_shexp.weight": "shared.w_gate", "ffn_up_shexp.weight": "shared.w_up",
    "ffn_down_shexp.weight": "shared.w_down", "ffn_gate_inp_shexp.weight": "shared.gate",
}
_TOP_NAMES = {"token_embd.weight": "embed", "output_norm.weight": "norm", "output.weight": "lm_head"}
_FAMILIES = {"llama": "llama", "qwen2": "qwen2", "qwen3": "qwen3", "qwen3moe": "qwen3_moe", "qwen2moe": "qwen2_moe"}


def _field_value(field: Any) -> Any:
    return field.contents()


def read_gguf(path: str | Path, dtype: torch.dtype = torch.float32) -> tuple[Model, Tokenizer]:
    """The model and tokenizer stored in the GGUF file at `path`."""
    import gguf  # deferred: importing gguf costs ~0.3 s that commands without GGUF never pay

    path = Path(path)
    if not path.is_file():
        raise ModelLoadError(f"{path}: no such GGUF file")
    try:
        reader = gguf.GGUFReader(path)
    except Exception as e:  # the reader raises ValueError/struct errors/... on a damaged file
        raise ModelLoadError(f"{path}: not a readable GGUF file ({type(e).__name__}: {e})") from None
    fields = {name: _field_value(f) for name, f in reader.fields.items()}
    spec = _spec_from_fields(fields, {t.name for t in reader.tensors}, path)
    weights: dict[str, torch.Tensor] = {}
    for tensor in reader.tensors:
        name = _canonical_name(tensor.name, path)
        try:
            array = gguf.quants.dequantize(tensor.data, tensor.tensor_type)
        except Exception as e:
            raise ModelLoadError(f"{path}: tensor {tensor.name!r} cannot be dequantized ({e})") from None
        t = torch.from_numpy(np.require(array, np.float32, ["C", "W"]))
        if spec.family == "llama" and name.endswith((".wq", ".wk")):
            heads = spec.num_heads if name.endswith(".wq") else spec.num_kv_heads
            t = _unpermute_rope_rows(t, heads)
        weights[name] = t.to(dtype)
    model = Model(spec, weights, source=f"gguf:{path}")
    model.validate(str(path))
    return model, tokenizer_from_gguf_fields(fields, str(path))


def _canonical_name(gguf_name: str, path: Path) -> str:
    if gguf_name in _TOP_NAMES:
        return _TOP_NAMES[gguf_name]
    m = _LAYER.match(gguf_name)
    if m and m.group(2) in _LAYER_NAMES:
        return f"layers.{m.group(1)}.{_LAYER_NAMES[m.group(2)]}"
    raise ModelLoadError(f"{path}: unknown tensor {gguf_name!r}: athanor reads llama/qwen2/qwen3/qwen3moe GGUF files")


def _unpermute_rope_rows(w: torch.Tensor, num_heads: int) -> torch.Tensor:
    # llama.cpp stored rows as [head, dim/2, pair]; HF's layout is [head, pair, dim/2].
    rest = w.shape[1:]
    return w.reshape(num_heads, w.shape[0] // num_heads // 2, 2, *rest).transpose(1, 2).reshape(w.shape)


def _spec_from_fields(fields: dict[str, Any], tensor_names: set[str], path: Path) -> ModelSpec:
    arch = fields.get("general.architecture")
    if arch not in _FAMILIES:
        raise ModelLoadError(f"{path}: general.architecture is {arch!r}; athanor reads {', '.join(_FAMILIES)}")

    def need(key: str) -> Any:
        full = f"{arch}.{key}"
        if full not in fields:
            raise ModelLoadError(f"{path}: metadata field {full!r} is missing")
        return fields[full]

    hidden = int(need("embedding_length"))
    heads = int(need("attention.head_count"))
    kv_heads = int(fields.get(f"{arch}.attention.head_count_kv", heads))
    head_dim = int(fields.get(f"{arch}.attention.key_length", hidden // heads))
    tokens = fields.get("tokenizer.ggml.tokens")
    vocab = int(fields.get(f"{arch}.vocab_size", len(tokens) if isinstance(tokens, list) else 0))
    scaling = None
    kind = fields.get(f"{arch}.rope.scaling.type")
    if kind not in (None, "none", "llama3"):  # a GGUF names no YaRN band or attention factor that HF configs carry
        raise ModelLoadError(f"{path}: {arch}.rope.scaling.type {kind!r} is not implemented for GGUF files (only "
                             "llama3 is), and the logits would be wrong; load the model's HF directory instead")
    if kind == "llama3":
        scaling = RopeScaling(
            factor=float(fields.get(f"{arch}.rope.scaling.factor", 8.0)),
            original_max_position_embeddings=int(fields.get(f"{arch}.rope.scaling.original_context_length", 8192)),
        )
    moe = None
    if f"{arch}.expert_count" in fields:
        moe = MoESpec(
            num_experts=int(need("expert_count")),
            top_k=int(need("expert_used_count")),
            intermediate_size=int(fields.get(f"{arch}.expert_feed_forward_length", need("feed_forward_length"))),
            shared_intermediate_size=int(fields.get(f"{arch}.expert_shared_feed_forward_length", 0)),
        )
    return ModelSpec(
        name=str(fields.get("general.name", path.stem)),
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=int(need("feed_forward_length")),
        num_layers=int(need("block_count")),
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        rope_theta=float(fields.get(f"{arch}.rope.freq_base", 10000.0)),
        rope_scaling=scaling,
        rms_norm_eps=float(need("attention.layer_norm_rms_epsilon")),
        max_position_embeddings=int(need("context_length")),
        tie_embeddings="output.weight" not in tensor_names,
        qk_norm=arch in ("qwen3", "qwen3moe"),
        attn_bias=arch == "qwen2",
        moe=moe,
        family=_FAMILIES[str(arch)],
    )

