"""The evaluator on the H200: A/A noise of a whole-model decode step, and a planted faster candidate.

Run on a lent GPU (`make gpu-test`); skipped without CUDA.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parents[1] / "unit" / "evaluate"))

import eval_candidates as c

from athanor.evaluate import EvaluateConfig, Evaluator

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

# A whole-model decode step of a random llama-3.2-1b in bf16 (16 layers), graphs captured. At least 200
# decode and 32 prefill pairs per shape, more until 1.5 s of timed runs (a 1-2 ms step gets ~300).
CONFIG = EvaluateConfig(model="llama-3.2-1b", device="cuda", dtype="bfloat16", tier="slow", max_seqs=8,
                        max_seq_len=512, decode_pairs=200, prefill_pairs=32, timing_budget_s=1.5,
                        traffic="preset:chat")

SLOWED_GPU = c.patched(
    "_reference_build = build\n"
    "def build(model, ctx):\n"
    "    forward = _reference_build(model, ctx)\n"
    "    decode = forward.decode\n"
    "    w = torch.randn(2048, 2048, device=ctx.device, dtype=ctx.dtype) / 64\n"
    "    def slow_decode(batch):\n"
    "        y = w\n"
    "        for _ in range(24):  # ~24 x 8 MB of extra reads per step: about 10% of a 1B decode step\n"
    "            y = torch.tanh(y @ w)\n"
    "        return decode(batch) + 0 * y[0, 0]\n"
    "    forward.decode = slow_decode\n"
    "    return forward\n",
    "the reference plus needless device work",
)


@pytest.fixture(scope="module")
def evaluator() -> Iterator[Evaluator]:
    with Evaluator(CONFIG) as ev:
        yield ev


def test_aa_noise_within_2_percent(evaluator: Evaluator) -> None:
    v = evaluator.evaluate(c.HONEST, incumbent=c.BASE)
    assert not v.accepted, v.reason
    tier = v.tiers[-1]
    decode = [m for m in tier.measurements if m.kind == "decode"]
    assert decode and all(m.num_layers == 16 for m in decode)
    figures = [(m.kind, m.speedup.num_pairs, m.paired, m.incumbent_cv, m.repeatability) for m in tier.measurements]
    assert 0.98 <= tier.noise.ci_low <= tier.noise.ci_high <= 1.02, (tier.noise, figures)
    assert v.speedup.ci_low >= 0.98 and v.speedup.ci_high <= 1.02, v.speedup  # reference vs itself
    for m in decode:  # a real step is never faster than reading its weights once
        assert m.candidate_s > m.floor_s / CONFIG.physical_slack


def test_planted_faster_candidate_is_accepted(evaluator: Evaluator) -> None:
    v = evaluator.evaluate(c.HONEST, incumbent=SLOWED_GPU)
    assert v.accepted, f"{v.stage}: {v.reason}"
    assert v.speedup.ci_low > 1.01
    assert v.gpu_s_per_1k_requests < v.incumbent_gpu_s_per_1k_requests
    assert v.tiers[-1].greedy_agreement == 1.0 or v.tiers[-1].greedy_agreement > 0.99
