"""The best-known candidates in bf16 on CPU (Triton kernels in the bf16-patched interpreter).

This is the sound form of the GPU's bf16 check. Two bf16 forward passes round differently, and
random-weight models have logits of std ~45 (the tied embedding gives the fed token's own logit
~1500, where one bf16 ulp is 8), so an element-wise `assert_close(candidate, reference, 5e-2)`
fails for a candidate that is exactly as accurate as the reference (on llama-3.2-1b's shapes, two
layers: 6.6% of logits out of tolerance, max difference 1.5, while both have a relative error of
0.0061 against fp64). The metric here: against an fp64 truth on the same bf16 weights, each row's
error is within twice the bf16 reference's own error, and greedy tokens agree with the truth
wherever its top two logits are further apart than the bf16 reference's own rounding noise. The last tests show that a wrong KV length, a wrong rope
position or a swapped fused-QKV split fail it.
"""

from __future__ import annotations

import functools
import importlib.util
import itertools
import sys
from pathlib import Path

import pytest
import torch

from athanor.kernels import HAS_TRITON
from athanor.model import BuildContext, DecodeBatch, Model, make_prefill_batch
from athanor.model.presets import PRESETS
from athanor.model.random_init import random_model
from athanor.model.reference import build as build_reference
from athanor.moves import best_options, render

pytestmark = pytest.mark.skipif(not HAS_TRITON, reason="Triton is not installed")
_serial = itertools.count()


def _load(source: str, tmp_path: Path):
    path = tmp_path / f"candidate_bf16_{next(_serial)}.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[path.stem] = module
    spec.loader.exec_module(module)
    return module


def _decode_logits(build, model, dtype) -> torch.Tensor:
    """Logits [3, vocab] fp64 of one decode step after prefilling prompts of 5, 40 and 17 tokens."""
    with torch.no_grad():
        fwd = build(model, BuildContext(torch.device("cpu"), dtype, max_seqs=4, max_seq_len=64))
        prompts = [[(7 * i + j) % model.spec.vocab_size for j in range(n)] for i, n in enumerate((5, 40, 17))]
        fwd.prefill(make_prefill_batch(prompts, [0, 1, 3]))
        pos = torch.tensor([5, 40, 17])
        return fwd.decode(DecodeBatch(torch.tensor([1, 2, 3]), pos, torch.tensor([0, 1, 3]), pos)).double()


@functools.cache
def _model_and_reference(preset: str, seed: int) -> tuple[Model, torch.Tensor, torch.Tensor]:
    """(bf16 random model, fp64 truth logits, bf16 reference logits), computed once per preset."""
    # Two layers, as test_moves_forward.LAYERS says why.
    model = random_model(PRESETS[preset].with_layers(2), seed=seed, dtype=torch.bfloat16)
    truth = _decode_logits(build_reference, model.to(dtype=torch.float64), torch.float64)
    return model, truth, _decode_logits(build_reference, model, torch.bfloat16)


def bf16_errors(source: str, preset: str, tmp_path: Path, seed: int = 0) -> tuple[list[float], list[float], bool]:
    """(candidate's per-row relative error vs fp64, the bf16 reference's, greedy agreement on decided rows)."""
    model, truth, ref = _model_and_reference(preset, seed)
    cand = _decode_logits(_load(source, tmp_path).build, model, torch.bfloat16)

    def row_err(x: torch.Tensor) -> list[float]:
        return ((x - truth).norm(dim=-1) / truth.norm(dim=-1)).tolist()

    top2 = truth.topk(2, dim=-1).values
    # Greedy must agree unless the truth's top two are within the bf16 reference's own rounding noise.
    decided = top2[:, 0] - top2[:, 1] > 2 * (ref - truth).abs().amax(dim=-1)
    return row_err(cand), row_err(ref), bool((cand.argmax(-1) == truth.argmax(-1))[decided].all())


def assert_as_accurate_as_reference(source: str, preset: str, tmp_path: Path, seed: int = 0) -> None:
    cand, ref, greedy_agrees = bf16_errors(source, preset, tmp_path, seed)
    assert all(c <= 2 * r for c, r in zip(cand, ref)), f"per-row relative error {cand} vs the reference's {ref}"
    assert greedy_agrees


@pytest.mark.parametrize("preset", ["tiny-dense", pytest.param("tiny-qwen", marks=pytest.mark.slow), "tiny-moe"])
def test_best_known_is_as_accurate_as_the_reference_in_bf16(preset, tmp_path):  # a dense and a MoE model; all: slow
    assert_as_accurate_as_reference(render("fast", best_options(PRESETS[preset])), preset, tmp_path)


def test_token_major_split_k_candidate_in_bf16(tmp_path):
    options = {**best_options(PRESETS["tiny-moe"]), "kv_layout": "token_major", "gemv": "triton_splitk",
               "fused_gate_up": True}
    assert_as_accurate_as_reference(render("fast", options), "tiny-moe", tmp_path)


def test_fused_moe_candidate_in_bf16(tmp_path):
    """The fused layer (MoE and its attention half) in bf16; the dense GEMV's rounding is checked against
    fp64 in tests/unit/kernels/test_bf16_kernels.py, the whole dense layer on the GPU."""
    source = render("fast", {**best_options(PRESETS["tiny-moe"]), "gemv": "triton_fused"})
    assert_as_accurate_as_reference(source.replace("FUSED_ROWS = 1\n", "FUSED_ROWS = 8\n"), "tiny-moe", tmp_path)


BROKEN = {
    "kv_len_off_by_one": ("return positions if self.lens_offset else positions + 1",
                          "return positions if self.lens_offset else positions.clamp(min=1)"),
    "rope_position_off_by_one": ("q, k = rope(q, k, self.cos, self.sin, positions,",
                                 "q, k = rope(q, k, self.cos, self.sin, positions + 1,"),
    "fused_qkv_split_swapped": ('torch.cat([get("wq"), get("wk"), get("wv")])',
                                'torch.cat([get("wq"), get("wv"), get("wk")])'),
}


@pytest.mark.parametrize("bug", sorted(BROKEN))
def test_the_metric_fails_a_real_bug(bug, tmp_path):
    # torch kernels (the metric is under test here, not Triton), with the fused QKV to break
    old, new = BROKEN[bug]
    source = render("fast", {"fused_qkv": True})
    assert old in source
    with pytest.raises(AssertionError):
        assert_as_accurate_as_reference(source.replace(old, new), "tiny-dense", tmp_path)
