"""Loaders: HF directories both ways, GGUF, presets, and every error path."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from athanor.errors import ConfigError, ModelLoadError
from athanor.model.hf import read_hf_dir, save_hf
from athanor.model.presets import PRESETS, get_preset
from athanor.model.random_init import random_model
from athanor.model.registry import load_model, load_model_and_tokenizer


@pytest.mark.parametrize("preset", ["tiny-dense", "tiny-qwen", "tiny-moe"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_hf_directory_round_trip(tmp_path: Path, preset: str, dtype: torch.dtype) -> None:
    model = random_model(get_preset(preset), seed=1, dtype=dtype)
    save_hf(model, tmp_path, hf_exact=False)  # tiny-moe is no HF class's function (test_hf_parity); athanor's own
    back, tokenizer = read_hf_dir(tmp_path)
    assert tokenizer is None
    assert back.spec == model.spec and back.dtype == dtype
    assert set(back.weights) == set(model.weights)
    for name, t in model.weights.items():
        assert torch.equal(back.weights[name], t), name


def test_sharded_directory_and_mixtral_names(tmp_path: Path) -> None:
    import dataclasses

    spec = dataclasses.replace(get_preset("tiny-moe"), family="mixtral", qk_norm=False,
                               moe=dataclasses.replace(get_preset("tiny-moe").moe, shared_intermediate_size=0,
                                                       shared_gate=False))
    model = random_model(spec, seed=2)
    save_hf(model, tmp_path, shard_bytes=200_000)
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 1
    assert "model.layers.0.block_sparse_moe.experts.3.w1.weight" in index["weight_map"]
    back = load_model(str(tmp_path))
    assert back.spec.moe == spec.moe
    assert all(torch.equal(back.weights[n], t) for n, t in model.weights.items())


def test_dtype_conversion_on_load(tmp_path: Path) -> None:
    save_hf(random_model(get_preset("tiny-dense"), dtype=torch.float32), tmp_path)
    assert load_model(str(tmp_path), dtype=torch.bfloat16).dtype == torch.bfloat16


def test_presets_have_the_published_shapes() -> None:
    for name in ("llama-3.2-1b", "llama-3.1-8b", "qwen3-30b-a3b", "mixtral-8x7b"):
        assert name in PRESETS
    # Parameter counts as published (within rounding of the names).
    assert abs(PRESETS["llama-3.2-1b"].num_params() / 1e9 - 1.24) < 0.01
    assert abs(PRESETS["llama-3.1-8b"].num_params() / 1e9 - 8.03) < 0.01
    assert abs(PRESETS["qwen3-30b-a3b"].num_params() / 1e9 - 30.5) < 0.1
    assert abs(PRESETS["qwen3-30b-a3b"].active_params_per_token() / 1e9 - 3.35) < 0.05
    assert abs(PRESETS["mixtral-8x7b"].num_params() / 1e9 - 46.7) < 0.1


def test_random_preset_names_and_seeds() -> None:
    a = load_model("random:tiny-dense@3")
    b = load_model("tiny-dense", seed=3)
    c = load_model("random:tiny-dense@4")
    assert torch.equal(a.get("embed"), b.get("embed")) and not torch.equal(a.get("embed"), c.get("embed"))


# -- error paths: one clear message naming the file or field -----------------------------------------
def _saved(tmp_path: Path) -> Path:
    save_hf(random_model(get_preset("tiny-dense")), tmp_path)
    return tmp_path


def test_unknown_preset() -> None:
    with pytest.raises(ConfigError, match="unknown model 'llama-9'"):
        load_model("llama-9")
    with pytest.raises(ConfigError, match="unknown model preset 'nope'"):
        get_preset("nope")


def test_missing_directory_and_files(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match="config.json: missing"):
        read_hf_dir(tmp_path)
    d = _saved(tmp_path / "m")
    (d / "model.safetensors").unlink()
    with pytest.raises(ModelLoadError, match="no model.safetensors"):
        read_hf_dir(d)
    with pytest.raises(ModelLoadError, match="no such model directory"):
        read_hf_dir(tmp_path / "absent")


def test_corrupt_config_and_weights(tmp_path: Path) -> None:
    d = _saved(tmp_path)
    (d / "config.json").write_text("{ not json")
    with pytest.raises(ModelLoadError, match=r"config.json: not valid JSON"):
        read_hf_dir(d)
    d2 = _saved(tmp_path / "b")
    weights = d2 / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])
    with pytest.raises(ModelLoadError, match="model.safetensors: corrupt"):
        read_hf_dir(d2)


def test_missing_config_field(tmp_path: Path) -> None:
    d = _saved(tmp_path)
    cfg = json.loads((d / "config.json").read_text())
    del cfg["hidden_size"]
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ModelLoadError, match="field 'hidden_size' is missing"):
        read_hf_dir(d)


def test_config_and_weights_that_do_not_match(tmp_path: Path) -> None:
    d = _saved(tmp_path)
    cfg = json.loads((d / "config.json").read_text())
    cfg["intermediate_size"] = 256
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ModelLoadError, match="w_gate' has shape .* config and weights do not match"):
        read_hf_dir(d)
    cfg["intermediate_size"] = 128
    cfg["num_hidden_layers"] = 5
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ModelLoadError, match="missing weight 'layers.4"):
        read_hf_dir(d)
    cfg["num_hidden_layers"] = 3
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ModelLoadError, match="unexpected weight 'layers.3"):
        read_hf_dir(d)


def test_unsupported_model_type(tmp_path: Path) -> None:
    d = _saved(tmp_path)
    cfg = json.loads((d / "config.json").read_text())
    cfg["model_type"] = "gpt_neox"
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ModelLoadError, match="model_type 'gpt_neox' is not supported"):
        read_hf_dir(d)


def test_gguf_errors(tmp_path: Path) -> None:
    from athanor.model.gguf_loader import read_gguf

    with pytest.raises(ModelLoadError, match="no such GGUF file"):
        read_gguf(tmp_path / "absent.gguf")
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF" + b"\x00" * 64)
    with pytest.raises(ModelLoadError, match="bad.gguf: not a readable GGUF file"):
        read_gguf(bad)
    other = tmp_path / "weights.bin"
    other.write_bytes(b"\x00" * 16)
    with pytest.raises(ModelLoadError, match="weights.bin: neither an HF model directory nor a .gguf file"):
        load_model_and_tokenizer(str(other))


def test_truncated_real_gguf(tmp_path: Path, smollm2_gguf: Path) -> None:
    from athanor.model.gguf_loader import read_gguf

    cut = tmp_path / "cut.gguf"
    with open(smollm2_gguf, "rb") as src:
        cut.write_bytes(src.read(20_000_000))
    with pytest.raises(ModelLoadError, match="cut.gguf"):
        read_gguf(cut)


BASE_CONFIG = {"model_type": "mistral", "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2,
               "intermediate_size": 128, "num_hidden_layers": 2, "vocab_size": 100, "max_position_embeddings": 32768}


@pytest.mark.parametrize(("extra", "needle"), [
    ({"rope_scaling": {"rope_type": "dynamic", "factor": 4.0}}, "rope_scaling of type 'dynamic' is not implemented"),
    ({"rope_scaling": {"type": "longrope", "factor": 2.0}}, "rope_scaling of type 'longrope'"),
    ({"quantization_config": {"quant_method": "mxfp4"}}, r"quantization_config \(mxfp4\)"),
])
def test_configs_that_would_compute_other_logits_are_refused_by_key(tmp_path: Path, extra: dict, needle: str) -> None:
    (tmp_path / "config.json").write_text(json.dumps({**BASE_CONFIG, **extra}))
    with pytest.raises(ModelLoadError, match=needle) as e:
        load_model(str(tmp_path))
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("extra", [
    {"sliding_window": None}, {"sliding_window": 32768},  # no window, or one as long as the context
    {"model_type": "qwen2", "use_sliding_window": False, "sliding_window": 4096},  # Qwen2's window, switched off
    {"rope_scaling": {"rope_type": "default"}},
])
def test_inert_settings_of_those_keys_still_load(extra: dict) -> None:
    from athanor.model.hf_config import spec_from_config

    spec = spec_from_config({**BASE_CONFIG, **extra}, Path("m/config.json"))
    assert spec.num_layers == 2 and not spec.windowed


@pytest.mark.parametrize("kind", ["linear", "yarn"])
def test_scaled_rope_round_trips_through_an_hf_directory(tmp_path: Path, kind: str) -> None:
    import dataclasses

    from athanor.model.spec import RopeScaling

    scaling = RopeScaling(factor=4.0, original_max_position_embeddings=16, kind=kind,
                          attention_factor=1.2 if kind == "yarn" else 1.0)
    if kind == "linear":  # a linear scaling has a factor only
        scaling = RopeScaling(factor=4.0, kind="linear")
    model = random_model(dataclasses.replace(get_preset("tiny-dense"), rope_scaling=scaling), seed=1)
    save_hf(model, tmp_path)
    assert read_hf_dir(tmp_path)[0].spec.rope_scaling == scaling
