"""Gemma 3 against HF transformers: tiny random text models saved by HF (alone, and as the text model of a
multimodal `gemma3` checkpoint) and loaded by athanor, and athanor's own random Gemma saved for HF to load; fp32 on
the CPU with the oracle's tolerance. Every Gemma numeric is exercised: (1 + weight) norms, the norms on attention's
and the MLP's outputs, scaled embeddings, GeGLU, the query_pre_attn_scalar scale, local layers with a window and a
RoPE base of their own beside scaled global ones, and soft-capped logits."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from hf_oracle import assert_matches_hf

from athanor.errors import ModelLoadError
from athanor.model import BuildContext
from athanor.model.hf import save_hf
from athanor.model.random_init import random_model
from athanor.model.registry import load_model

WINDOW = 6
LAYER_TYPES = ["sliding_attention", "full_attention", "sliding_attention"]


def _hf_gemma(**extra):  # type: ignore[no-untyped-def]
    import transformers

    config = transformers.Gemma3TextConfig(
        vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, query_pre_attn_scalar=24, sliding_window=WINDOW,
        max_position_embeddings=64, layer_types=LAYER_TYPES, final_logit_softcapping=0.5,
        rope_parameters={"full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 100000.0},
                         "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}}, **extra)
    torch.manual_seed(0)
    model = transformers.Gemma3ForCausalLM(config).eval()
    with torch.no_grad():  # HF starts its norms at zero (a scale of one): move every weight off its start
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    return model


def test_gemma3_text_matches_hf(tmp_path: Path) -> None:
    hf = _hf_gemma()
    hf.save_pretrained(tmp_path)
    model = load_model(str(tmp_path))
    spec = model.spec
    assert spec.layer_windows == (WINDOW, 0, WINDOW) and spec.local_rope_theta == 10000.0
    assert spec.rope_theta == 100000.0 and spec.rope_scaling is not None and spec.rope_scaling.factor == 2.0
    assert spec.attn_scale == pytest.approx(24 ** -0.5) and spec.final_logit_softcap == 0.5
    assert_matches_hf(hf, model)


def test_the_text_model_of_a_multimodal_gemma3_checkpoint(tmp_path: Path) -> None:
    """A `gemma3` config keeps the text model's fields in `text_config` (only those that differ from the defaults)
    and its tensors under `model.language_model.`, beside a vision tower that is not read."""
    from safetensors.torch import load_file, save_file

    hf = _hf_gemma()
    hf.save_pretrained(tmp_path / "text")
    text_cfg = json.loads((tmp_path / "text" / "config.json").read_text())
    tensors = load_file(str(tmp_path / "text" / "model.safetensors"))
    mm = tmp_path / "mm"
    mm.mkdir()
    renamed = {name.replace("model.", "model.language_model.", 1): t for name, t in tensors.items()}
    renamed["model.vision_tower.vision_model.embeddings.patch_embedding.weight"] = torch.zeros(2, 3)
    save_file(renamed, str(mm / "model.safetensors"))
    defaults = {"head_dim": 256, "rms_norm_eps": 1e-6, "tie_word_embeddings": True}  # left out as the hub's are
    text_only = {k: v for k, v in text_cfg.items() if k not in defaults or v != defaults[k]}
    (mm / "config.json").write_text(json.dumps({"model_type": "gemma3", "architectures": ["Gemma3ForConditionalGeneration"],
                                                "text_config": text_only}))
    assert_matches_hf(hf, load_model(str(mm)))


def test_a_random_gemma_saved_by_athanor_is_the_same_function_in_hf(tmp_path: Path) -> None:
    import transformers

    spec = load_model(str(_saved(tmp_path / "hf"))).spec
    model = random_model(spec, seed=3, device=torch.device("cpu"), dtype=torch.float32)
    gen = torch.Generator().manual_seed(4)
    for t in model.weights.values():  # its four norms a layer start alike: a name saved for another must show
        t.add_(torch.randn(t.shape, generator=gen) * 0.1)
    save_hf(model, tmp_path / "ours")
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "ours"), dtype=torch.float32).eval()
    assert_matches_hf(hf, model)  # the model in memory, not its reading back: a name swapped both ways shows


def _saved(directory: Path) -> Path:
    _hf_gemma().save_pretrained(directory)
    return directory


@pytest.mark.parametrize(("key", "value"), [("attn_logit_softcapping", 50.0), ("use_bidirectional_attention", True)])
def test_what_gemma_computes_and_athanor_does_not_is_refused_by_key(tmp_path: Path, key: str, value: object) -> None:
    directory = _saved(tmp_path)
    cfg = json.loads((directory / "config.json").read_text())
    (directory / "config.json").write_text(json.dumps({**cfg, key: value}))
    with pytest.raises(ModelLoadError, match=key):
        load_model(str(directory))


def _tiny(preset: str, **changes):  # type: ignore[no-untyped-def]
    import dataclasses

    from athanor.model.presets import PRESETS

    spec = PRESETS[preset]
    moe = changes.pop("moe", {})
    return dataclasses.replace(spec, **changes, moe=spec.moe and dataclasses.replace(spec.moe, **moe))


TINY_FAMILIES = {
    "llama": _tiny("tiny-dense"), "qwen3": _tiny("tiny-qwen"),
    "qwen3_moe": _tiny("tiny-moe", moe={"shared_intermediate_size": 0, "shared_gate": False}),
    "qwen2_moe": _tiny("tiny-moe", family="qwen2_moe", qk_norm=False, attn_bias=True),
    "qwen3_moe-dense-layer": _tiny("tiny-moe", dense_layers=(1,), moe={"shared_intermediate_size": 0,
                                                                         "shared_gate": False}),
    "mixtral": _tiny("tiny-moe", family="mixtral", qk_norm=False, moe={"shared_intermediate_size": 0,
                                                                        "shared_gate": False}),
}


@pytest.mark.parametrize("family", TINY_FAMILIES)
def test_a_random_model_of_each_family_saved_by_athanor_is_the_same_function_in_hf(tmp_path: Path,
                                                                                   family: str) -> None:
    import transformers

    model = random_model(TINY_FAMILIES[family], seed=5, device=torch.device("cpu"), dtype=torch.float32)
    save_hf(model, tmp_path)
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path), dtype=torch.float32).eval()
    assert hf.config.model_type == family.split("-")[0]
    assert_matches_hf(hf, model)


def test_a_spec_no_hf_class_computes_is_not_saved_for_hf(tmp_path: Path) -> None:
    """tiny-moe (Qwen3-MoE's q/k norms beside Qwen2-MoE's gated shared expert) is athanor's test of every MoE path;
    HF would load its directory as Qwen3-MoE and drop the shared expert."""
    from athanor.errors import ConfigError
    from athanor.model.presets import PRESETS

    with pytest.raises(ConfigError, match="shared expert"):
        save_hf(random_model(PRESETS["tiny-moe"]), tmp_path)
    assert not (tmp_path / "config.json").exists()


def test_the_fast_template_declines_gemma_naming_what_it_lacks(tmp_path: Path) -> None:
    from athanor.moves.render import render

    model = load_model(str(_saved(tmp_path)))
    namespace: dict = {}
    exec(compile(render("fast", {}), "fast.py", "exec"), namespace)
    with pytest.raises(NotImplementedError, match=r"\(1 \+ weight\) norms, sandwich norms, scaled embeddings"):
        namespace["build"](model, BuildContext(torch.device("cpu"), torch.float32, max_seqs=1, max_seq_len=16))


def _hf_gpt_oss():  # type: ignore[no-untyped-def]
    import transformers

    config = transformers.GptOssConfig(
        vocab_size=128, hidden_size=64, intermediate_size=32, num_hidden_layers=3, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, num_local_experts=4, num_experts_per_tok=2, sliding_window=WINDOW,
        max_position_embeddings=64, swiglu_limit=0.5,  # a limit the random activations reach, so the clamp shows
        rope_parameters={"rope_type": "yarn", "factor": 4.0, "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False,
                         "original_max_position_embeddings": 16, "rope_theta": 10000.0})
    torch.manual_seed(0)
    model = transformers.GptOssForCausalLM(config).eval()
    with torch.no_grad():  # HF starts biases at zero and sinks small: move every weight off its start
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.3)
    return model


def test_gpt_oss_matches_hf(tmp_path: Path) -> None:
    """Attention sinks, biases on q, k, v and o, alternating windows, YaRN without truncation, a router with a bias
    softmaxed over its top k, experts with biases and the clamped SwiGLU, packed gate/up tensors."""
    hf = _hf_gpt_oss()
    hf.save_pretrained(tmp_path / "hf")
    model = load_model(str(tmp_path / "hf"))
    spec = model.spec
    assert spec.attn_sinks and spec.out_bias and spec.layer_windows == (WINDOW, 0, WINDOW)
    assert spec.moe is not None and spec.moe.expert_bias and spec.moe.logit_bias and spec.moe.swiglu_limit == 0.5
    assert_matches_hf(hf, model)
    save_hf(model, tmp_path / "ours")  # and back: the packed experts written as HF reads them
    import transformers

    again = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "ours"), dtype=torch.float32).eval()
    assert_matches_hf(again, model)


def _hf_deepseek_v3(**extra):  # type: ignore[no-untyped-def]
    import transformers

    config = transformers.DeepseekV3Config(**{
        "vocab_size": 128, "hidden_size": 64, "intermediate_size": 96, "moe_intermediate_size": 16,
        "num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 4, "n_shared_experts": 1,
        "n_routed_experts": 8, "kv_lora_rank": 16, "q_lora_rank": 24, "qk_rope_head_dim": 8, "v_head_dim": 12,
        "qk_nope_head_dim": 16, "n_group": 4, "topk_group": 2, "num_experts_per_tok": 2, "first_k_dense_replace": 1,
        "routed_scaling_factor": 2.5, "max_position_embeddings": 64,
        "rope_parameters": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16,
                            "mscale": 1.0, "mscale_all_dim": 1.0, "beta_fast": 32.0, "beta_slow": 1.0,
                            "rope_theta": 10000.0}, **extra})
    torch.manual_seed(0)
    model = transformers.DeepseekV3ForCausalLM(config).eval()
    with torch.no_grad():  # off HF's starting values (unit norms, zero correction bias) so that each one shows
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.1)
        for layer in model.model.layers[1:]:
            layer.mlp.gate.e_score_correction_bias.add_(torch.randn(8) * 0.1)
    return model


@pytest.mark.parametrize("variant", [{}, {"q_lora_rank": None, "rope_interleave": False}], ids=["lora-q", "plain-q"])
def test_deepseek_v3_matches_hf(tmp_path: Path, variant: dict) -> None:
    """Multi-head latent attention (a low-rank query or a plain one; interleaved RoPE on the rotary part or halves),
    YaRN with mscale_all_dim in the softmax scale, sigmoid routing limited to the best groups with a choice-only
    correction bias and a scaling factor, a shared expert, and a dense first layer."""
    hf = _hf_deepseek_v3(**variant)
    hf.save_pretrained(tmp_path)
    model = load_model(str(tmp_path))
    spec = model.spec
    assert spec.mla is not None and spec.dense_layers == (0,) and spec.moe is not None
    assert (spec.moe.num_groups, spec.moe.top_groups, spec.moe.routed_scale) == (4, 2, 2.5)
    assert_matches_hf(hf, model)
