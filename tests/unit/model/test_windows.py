"""Sliding-window attention against HF transformers: tiny random models of each family that has it, saved by HF
and loaded by athanor, prefilled (alone and beside a shorter sequence, in chunks) and decoded past the window,
fp32 on the CPU with the oracle's tolerance. A mask that saw one key too many or too few fails here."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from hf_oracle import assert_matches_hf

from athanor.model import BuildContext
from athanor.model.hf_config import layer_windows
from athanor.model.registry import load_model

WINDOW = 6
SHAPE = dict(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=64)


def _hf_model(kind: str):  # type: ignore[no-untyped-def]
    import transformers

    if kind == "mistral":
        config = transformers.MistralConfig(**SHAPE, sliding_window=WINDOW)
        return transformers.MistralForCausalLM(config), (WINDOW,) * 3
    if kind == "mixtral":
        config = transformers.MixtralConfig(**SHAPE, sliding_window=WINDOW, num_local_experts=4,
                                            num_experts_per_tok=2)
        return transformers.MixtralForCausalLM(config), (WINDOW,) * 3
    if kind == "qwen2":  # the first max_window_layers layers see every key
        config = transformers.Qwen2Config(**SHAPE, use_sliding_window=True, sliding_window=WINDOW, max_window_layers=1)
        return transformers.Qwen2ForCausalLM(config), (0, WINDOW, WINDOW)
    config = transformers.Qwen3Config(**SHAPE, use_sliding_window=True, sliding_window=WINDOW,  # explicit layer_types
                                      layer_types=["sliding_attention", "full_attention", "sliding_attention"])
    return transformers.Qwen3ForCausalLM(config), (WINDOW, 0, WINDOW)


@pytest.mark.parametrize("kind", ["mistral", "mixtral", "qwen2", "qwen3-layer-types"])
def test_windowed_attention_matches_hf(tmp_path: Path, kind: str) -> None:
    torch.manual_seed(0)
    hf, windows = _hf_model(kind)
    hf = hf.eval()
    hf.save_pretrained(tmp_path)
    model = load_model(str(tmp_path))
    assert model.spec.layer_windows == windows
    assert_matches_hf(hf, model)


def test_a_window_the_context_covers_or_a_switched_off_one_is_none() -> None:
    base = {"num_hidden_layers": 2, "max_position_embeddings": 64}
    where = Path("m/config.json")
    assert layer_windows({**base, "sliding_window": 64}, "mistral", 2, where) == ()
    assert layer_windows({**base, "sliding_window": 8, "use_sliding_window": False}, "qwen2", 2, where) == ()
    assert layer_windows({**base, "sliding_window": 0, "use_sliding_window": True}, "qwen2_moe", 2, where) == ()
    assert layer_windows({**base, "sliding_window": 8}, "mistral", 2, where) == (8, 8)


def test_the_fast_template_declines_a_windowed_model_by_name() -> None:
    import dataclasses

    from athanor.model.random_init import random_model
    from athanor.model.registry import load_spec
    from athanor.moves.render import render

    spec = load_spec("tiny-dense")
    spec = dataclasses.replace(spec, layer_windows=(4,) * spec.num_layers)
    model = random_model(spec, seed=0, device=torch.device("cpu"), dtype=torch.float32)
    namespace: dict = {}
    exec(compile(render("fast", {}), "fast.py", "exec"), namespace)
    with pytest.raises(NotImplementedError, match="sliding-window attention"):
        namespace["build"](model, BuildContext(torch.device("cpu"), torch.float32, max_seqs=1, max_seq_len=16))
