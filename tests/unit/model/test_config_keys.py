"""Every field of each supported family's transformers config, set one at a time to a value other than its default:
the directory HF saves either loads into the function HF computes (the oracle's tolerance over a prefill and decode
steps) or is refused in one line naming the field. Never a model that loads and computes something else."""

from __future__ import annotations

import tempfile
from typing import Any

import pytest
import torch

from athanor.errors import ModelLoadError
from athanor.model import BuildContext, DecodeBatch, make_prefill_batch
from athanor.model.reference import build
from athanor.model.registry import load_model

SHAPE = dict(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=64)
MOE = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32)
FAMILIES: dict[str, tuple[str, dict[str, Any]]] = {  # config class, the tiny shape's own fields
    "llama": ("LlamaConfig", {}), "mistral": ("MistralConfig", {}), "qwen2": ("Qwen2Config", {}),
    "qwen3": ("Qwen3Config", {"head_dim": 16}),
    "mixtral": ("MixtralConfig", {"num_local_experts": 4, "num_experts_per_tok": 2}),
    "qwen3_moe": ("Qwen3MoeConfig", {"head_dim": 16, **MOE}),
    "qwen2_moe": ("Qwen2MoeConfig", {**MOE, "shared_expert_intermediate_size": 48}),
    "gemma3_text": ("Gemma3TextConfig", {"head_dim": 16, "query_pre_attn_scalar": 24, "sliding_window": 6}),
    "deepseek_v3": ("DeepseekV3Config", {"moe_intermediate_size": 16, "n_routed_experts": 8, "kv_lora_rank": 16,
                                         "q_lora_rank": 24, "qk_rope_head_dim": 8, "v_head_dim": 12,
                                         "qk_nope_head_dim": 16, "n_group": 4, "topk_group": 2,
                                         "num_experts_per_tok": 2, "first_k_dense_replace": 1, "num_key_value_heads": 4}),
    "gpt_oss": ("GptOssConfig", {"head_dim": 16, "num_local_experts": 4, "num_experts_per_tok": 2, "sliding_window": 6,
                                 "intermediate_size": 32, "swiglu_limit": 0.5}),
}
FRAMEWORK = {"architectures", "model_type", "transformers_version", "dtype", "torch_dtype", "_name_or_path", "id2label",
             "label2id", "problem_type", "return_dict", "output_hidden_states", "output_attentions", "is_encoder_decoder",
             "tokenizer_class", "chunk_size_feed_forward", "tie_encoder_decoder", "add_cross_attention", "is_decoder",
             "cross_attention_hidden_size", "pruned_heads", "prefix", "task_specific_params", "finetuning_task",
             "torchscript", "use_bfloat16"}
"""transformers' own bookkeeping, no model's math."""
OTHER_VALUES: dict[str, list[Any]] = {  # values that a default's type does not suggest
    "hidden_act": ["gelu_pytorch_tanh", "gelu"], "hidden_activation": ["silu", "gelu"],
    "sliding_window": [6], "layer_types": [["sliding_attention", "full_attention", "sliding_attention"]],
    "mlp_only_layers": [[1]],
    "rope_parameters": [{"rope_type": "linear", "factor": 2.0}, {"rope_type": "yarn", "factor": 2.0,
                                                                  "original_max_position_embeddings": 32},
                        {"rope_type": "dynamic", "factor": 2.0}, {"rope_type": "longrope", "factor": 2.0}],
}
DEFAULT_TIER = ("llama", "qwen3_moe", "gemma3_text")


def _other_values(key: str, default: Any) -> list[Any]:
    if key in OTHER_VALUES:
        return OTHER_VALUES[key]
    if isinstance(default, bool):
        return [not default]
    if isinstance(default, int | float):
        return [default * 2 if default else type(default)(1)]
    return []


def _verdict(family: str, changes: dict[str, Any]) -> tuple[str, str]:
    """("ok" | "refused" | "wrong" | "hf-invalid", detail) of a tiny HF model with `changes` to its config."""
    import transformers

    config_class, shape = FAMILIES[family]
    try:
        config = getattr(transformers, config_class)(**{**SHAPE, **shape, **changes})
        torch.manual_seed(0)
        hf = transformers.AutoModelForCausalLM.from_config(config).eval()
        with torch.no_grad():
            for p in hf.parameters():  # off HF's starting values (zero biases, unit norms) so that each one shows
                p.add_(torch.randn_like(p) * 0.05)
            ids = torch.randint(0, config.vocab_size, (20,), generator=torch.Generator().manual_seed(1)).tolist()
            want = hf(torch.tensor([ids])).logits[0, 9:]
    except Exception as e:  # a config HF itself does not build or run a model from (its validators raise their own)
        return "hf-invalid", str(e)
    with tempfile.TemporaryDirectory() as directory:
        hf.save_pretrained(directory)
        try:
            model = load_model(directory)
        except ModelLoadError as e:
            return "refused", str(e)
    with torch.no_grad():
        fwd = build(model, BuildContext(torch.device("cpu"), torch.float32, max_seqs=1, max_seq_len=32))
        got = [fwd.prefill(make_prefill_batch([ids[:10]], [0]))[0]]
        for n in range(10, 20):
            pos = torch.tensor([n])
            got.append(fwd.decode(DecodeBatch(torch.tensor([ids[n]]), pos, torch.tensor([0]), pos))[0])
    err, bound = (torch.stack(got) - want).abs().max().item(), 1e-4 * want.abs().max().item()
    return ("ok" if err <= bound else "wrong"), f"max |ours - HF| = {err:.3g} > {bound:.3g}"


@pytest.mark.parametrize("family", [f if f in DEFAULT_TIER else pytest.param(f, marks=pytest.mark.slow)
                                    for f in FAMILIES])
def test_every_config_field_is_computed_as_hf_does_or_refused_by_name(family: str) -> None:
    import transformers

    config_class, shape = FAMILIES[family]
    defaults = getattr(transformers, config_class)(**{**SHAPE, **shape}).to_dict()
    assert _verdict(family, {}) [0] == "ok"
    outcomes: dict[str, list[str]] = {"ok": [], "refused": [], "hf-invalid": []}
    for key, default in sorted(defaults.items()):
        if key in FRAMEWORK or key in SHAPE:
            continue
        for value in _other_values(key, default):
            changes = {key: value}
            if key == "sliding_window" and family.startswith("qwen"):
                changes["use_sliding_window"] = True
            verdict, detail = _verdict(family, changes)
            assert verdict != "wrong", f"{family} {key}={value!r}: loads and computes other logits ({detail})"
            if verdict == "refused":  # in one line, naming the field
                named = "rope" if key == "rope_parameters" else key
                assert named in detail and "\n" not in detail, f"{family} {key}={value!r}: {detail}"
            outcomes[verdict].append(key)
    assert outcomes["ok"], outcomes  # the sweep reached the loader
