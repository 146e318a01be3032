"""Engine slots sized to the GPU: the plan that keeps a compile's engine workers (three per tier) in memory."""

from __future__ import annotations

import pytest

from athanor.errors import ConfigError
from athanor.loop.memory import GIB, plan_engine_slots
from athanor.model.presets import PRESETS

H200 = int(139.8 * GIB)


def _plan(model: str, itemsize: int = 2, max_seq_len: int = 4096, device: int = H200, wanted: int = 64):
    spec = PRESETS[model]
    return plan_engine_slots(spec, itemsize, (max(2, spec.num_layers // 5), spec.num_layers), max_seq_len, device,
                             wanted)


def test_a_small_model_keeps_the_default_slots():
    assert _plan("llama-3.2-1b").max_seqs == 64


@pytest.mark.xfail(strict=True, reason="each judge worker holds its own 16 GB of 8B weights (3 per tier on a GPU) "
                                      "until they share read-only weights: 3 slots plan at 4096 tokens")
def test_an_8b_model_gets_fewer_slots_than_ran_out_of_memory_on_an_h200():
    """32 slots ran out of memory on an H200 with both tiers resident; the plan stays below and fits."""
    plan = _plan("llama-3.1-8b")
    assert 8 <= plan.max_seqs < 32
    assert plan.fixed_bytes + (plan.max_seqs + 1) * plan.kv_bytes_per_slot <= 0.9 * H200
    assert _plan("llama-3.1-8b", max_seq_len=1024).max_seqs > plan.max_seqs  # shorter contexts, more slots


def test_an_8b_model_fits_an_h200_with_fewer_slots_at_longer_contexts():
    plan = _plan("llama-3.1-8b")
    assert 1 <= plan.max_seqs < 32
    assert plan.fixed_bytes + (plan.max_seqs + 1) * plan.kv_bytes_per_slot <= 0.9 * H200
    assert _plan("llama-3.1-8b", max_seq_len=1024).max_seqs > plan.max_seqs



@pytest.mark.parametrize(("model", "itemsize"), [("qwen3-30b-a3b", 2), ("llama-3.1-8b", 4)])
def test_a_model_that_cannot_fit_names_what_to_change(model, itemsize):
    """qwen3-30b-a3b: three copies of 61 GB of weights in the slow tier alone; an fp32 8B: three of 32 GB."""
    with pytest.raises(ConfigError, match="--max-seq-len.*--dtype"):
        _plan(model, itemsize=itemsize)
