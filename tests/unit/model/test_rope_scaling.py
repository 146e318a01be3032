"""RoPE scalings against HF transformers: a tiny random Llama of each kind, saved by HF and loaded by athanor,
prefilled past the original context and decoded a few steps (fp32, the oracle's tolerance)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from athanor.model import BuildContext, DecodeBatch, make_prefill_batch
from athanor.model.reference import build
from athanor.model.registry import load_model

SCALINGS = [
    {"rope_type": "linear", "factor": 2.0},
    {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16},
    {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16, "beta_fast": 16.0,
     "beta_slow": 2.0, "attention_factor": 1.3},
    {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16, "beta_fast": 12.0, "truncate": False},
    {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
     "original_max_position_embeddings": 16},
]


@pytest.mark.parametrize("scaling", SCALINGS, ids=lambda s: "-".join(f"{v}" for v in s.values()))
def test_scaled_rope_matches_hf(tmp_path: Path, scaling: dict) -> None:
    import transformers

    config = transformers.LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                      rope_parameters={"rope_theta": 10000.0, **scaling})
    torch.manual_seed(0)
    hf = transformers.LlamaForCausalLM(config).eval()
    hf.save_pretrained(tmp_path)
    model = load_model(str(tmp_path))
    assert model.spec.rope_scaling is not None and model.spec.rope_scaling.kind == scaling["rope_type"]
    ids = torch.randint(0, 128, (44,), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = hf(ids[None]).logits[0]  # [44, vocab]
        fwd = build(model, BuildContext(torch.device("cpu"), torch.float32, max_seqs=1, max_seq_len=64))
        got = [fwd.prefill(make_prefill_batch([ids[:40].tolist()], [0]))[0]]
        for n in range(40, 44):  # decode steps past the original context of 16
            pos = torch.tensor([n])
            got.append(fwd.decode(DecodeBatch(ids[n:n + 1], pos, torch.tensor([0]), pos))[0])
    bound = 1e-4 * want.abs().max().item()
    err = (torch.stack(got) - want[39:44]).abs().max().item()
    assert err <= bound, f"max |ours - HF| = {err:.3g} > {bound:.3g}"
