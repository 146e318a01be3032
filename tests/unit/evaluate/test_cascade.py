"""The cascade end to end on tiny-dense (CPU): honest candidates judged right, every planted cheat refused."""

from __future__ import annotations

import json

import eval_candidates as c
import pytest

from athanor.evaluate import Evaluator, Verdict


def _show(v: Verdict) -> str:
    return f"{v.stage}: {v.reason} speedup={v.speedup}"


# -- honest candidates -----------------------------------------------------------------------------
@pytest.mark.timing  # its verdict rests on measured speed: run alone (Makefile `test`)
def test_honest_faster_candidate_is_accepted(evaluator: Evaluator) -> None:
    v = evaluator.evaluate(c.HONEST, incumbent=c.SLOWED)
    assert v.accepted and v.stage == "accepted", _show(v)
    assert v.speedup.ci_low > 1.01
    assert v.gpu_s_per_1k_requests < v.incumbent_gpu_s_per_1k_requests
    tier = v.tiers[0]
    assert tier.greedy_agreement == 1.0 and tier.max_abs_err < 1e-3
    assert {m.kind for m in tier.measurements} == {"decode", "prefill"}
    json.dumps(v.to_dict())  # serialisable
    assert Verdict.from_dict(json.loads(json.dumps(v.to_dict()))).accepted


def test_warm_up_leaves_the_incumbent_and_its_twin_resident_in_their_workers(evaluator: Evaluator,
                                                             caplog: pytest.LogCaptureFixture) -> None:
    # Run on CUDA engines as they start; called here on the CPU's to show it runs every script and leaves the
    # engine ready to evaluate (the next tests evaluate on these engines).
    from athanor.evaluate.engines import twin_of

    engines = evaluator.engines("fast")
    with caplog.at_level("INFO", logger="athanor.evaluate.cascade"):
        evaluator.warm(engines)
    incumbent = engines.incumbent.incumbent
    assert engines.incumbent.stats().resident == (incumbent.id,)
    assert engines.twin.stats().resident == (twin_of(incumbent).id,)
    assert any("warmed" in r.getMessage() and "(5 scripts)" in r.getMessage() for r in caplog.records)


@pytest.mark.timing  # its verdict rests on measured speed: run alone (Makefile `test`)
def test_reference_is_no_faster_than_itself(evaluator: Evaluator) -> None:
    v = evaluator.evaluate(c.HONEST, incumbent=c.BASE)
    assert not v.accepted and v.stage == "timing", _show(v)
    assert v.speedup.ci_low < 1.01
    noise = v.tiers[0].noise
    assert 0.95 < noise.ci_low <= noise.ci_high < 1.05, noise


@pytest.mark.timing  # its verdict rests on measured speed: run alone (Makefile `test`)
def test_slower_candidate_is_rejected(evaluator: Evaluator) -> None:
    v = evaluator.evaluate(c.SLOWER, incumbent=c.BASE)
    assert not v.accepted and v.stage == "timing", _show(v)
    assert v.speedup.ci_high < 1.0


def test_wrong_logits_are_rejected_at_correctness(evaluator: Evaluator) -> None:
    v = evaluator.evaluate(c.WRONG, incumbent=c.BASE)
    assert not v.accepted and v.stage == "correctness", _show(v)
    assert "tolerance" in v.reason


def test_a_forward_that_ignores_the_block_table_is_rejected_at_correctness(evaluator: Evaluator) -> None:
    # Self-consistent until a slot reads a prefix it shares with another (the check script's last step), as a
    # server's prefix cache and preemption make it do.
    v = evaluator.evaluate(c.IGNORES_TABLE, incumbent=c.BASE)
    assert not v.accepted and v.stage == "correctness", _show(v)


def test_identical_source_is_rejected(evaluator: Evaluator) -> None:
    v = evaluator.evaluate(c.BASE, incumbent=c.BASE)
    assert not v.accepted and v.stage == "static"


# -- one planted cheat per adversarial measure --------------------------------------------------------
@pytest.mark.timing  # its verdict rests on measured speed: run alone (Makefile `test`)
def test_memoising_gains_nothing_on_fresh_inputs(evaluator: Evaluator) -> None:
    # Fast only when an input repeats; the evaluator never repeats one, so it is as slow as SLOWED.
    v = evaluator.evaluate(c.MEMO, incumbent=c.SLOWED)
    assert not v.accepted, _show(v)
    assert v.stage == "timing"


def test_cached_logits_from_a_previous_call_are_caught(evaluator: Evaluator) -> None:
    v = evaluator.evaluate(c.CACHED, incumbent=c.BASE)
    assert not v.accepted and v.stage in ("smoke", "correctness"), _show(v)


def test_unwritten_outputs_show_the_poison(evaluator: Evaluator) -> None:
    v = evaluator.evaluate(c.NO_WRITE, incumbent=c.BASE)
    assert not v.accepted and v.stage == "correctness", _show(v)
    assert "NaN" in v.reason


def test_greedy_tokens_that_are_not_the_argmax_are_caught(evaluator: Evaluator) -> None:
    v = evaluator.evaluate(c.FAKE_TOKENS, incumbent=c.BASE)
    assert not v.accepted and "not the argmax of its logits" in v.reason, _show(v)


def test_behaving_differently_when_timed_is_caught_by_reverification(evaluator: Evaluator) -> None:
    v = evaluator.evaluate(c.TIMING_AWARE, incumbent=c.BASE)
    assert not v.accepted and v.stage == "timing", _show(v)
    assert "while timing" in v.reason


def test_modified_weights_are_caught(evaluator: Evaluator) -> None:
    v = evaluator.evaluate(c.WEIGHTS, incumbent=c.BASE)
    assert not v.accepted and v.stage == "integrity", _show(v)
    assert "weights" in v.reason
    # The worker was replaced: the next honest evaluation sees clean weights.
    assert evaluator.evaluate(c.WRONG, incumbent=c.BASE).stage == "correctness"


@pytest.mark.parametrize("cheat", ["PATCH_TIMER", "PATCH_COMPARE"])
def test_patching_at_import_or_build_is_a_violation(runtime_evaluator: Evaluator, cheat: str) -> None:
    v = runtime_evaluator.evaluate(getattr(c, cheat), incumbent=c.BASE)
    assert not v.accepted and v.stage == "smoke", _show(v)
    assert "replaced" in v.reason


def test_patching_while_running_is_caught(runtime_evaluator: Evaluator) -> None:
    v = runtime_evaluator.evaluate(c.PATCH_AT_RUN, incumbent=c.BASE)
    # The swap's first step already runs decode: the patch shows at smoke (or at the probe after).
    assert not v.accepted and v.stage in ("smoke", "integrity"), _show(v)
    assert "torch.equal" in v.reason


def test_threads_are_caught_at_runtime(runtime_evaluator: Evaluator) -> None:
    v = runtime_evaluator.evaluate(c.THREADS, incumbent=c.BASE)
    assert not v.accepted and v.stage == "integrity", _show(v)
    assert "threads" in v.reason


def test_network_is_a_violation(runtime_evaluator: Evaluator) -> None:
    v = runtime_evaluator.evaluate(c.NETWORK, incumbent=c.BASE)
    assert not v.accepted and v.stage == "smoke", _show(v)
    assert "network" in v.reason


def test_static_stage_refuses_before_running(evaluator: Evaluator) -> None:
    for cheat in (c.THREADS, c.NETWORK, c.PATCH_TIMER):
        v = evaluator.evaluate(cheat, incumbent=c.BASE)
        assert v.stage == "static" and not v.accepted, _show(v)


# -- --bitwise and the quality budget ------------------------------------------------------------------
@pytest.mark.timing  # its verdict rests on measured speed: run alone (Makefile `test`)
def test_tolerance_admits_what_bitwise_refuses(evaluator: Evaluator, bitwise_evaluator: Evaluator) -> None:
    loose = evaluator.evaluate(c.NUDGED, incumbent=c.SLOWED)
    assert loose.stage not in ("static", "smoke", "correctness"), _show(loose)
    strict = bitwise_evaluator.evaluate(c.NUDGED, incumbent=c.SLOWED)
    assert not strict.accepted and strict.stage == "correctness", _show(strict)
    assert "--bitwise" in strict.reason
    same = bitwise_evaluator.evaluate(c.HONEST, incumbent=c.SLOWED)  # the reference's own ops: identical
    assert same.accepted, _show(same)


@pytest.mark.timing  # its verdict rests on measured speed: run alone (Makefile `test`)
def test_lossy_weights_pass_only_within_a_quality_budget(evaluator: Evaluator,
                                                          quality_evaluator: Evaluator,
                                                          tight_quality_evaluator: Evaluator) -> None:
    exact = evaluator.evaluate(c.LOSSY, incumbent=c.SLOWED)
    assert not exact.accepted and exact.stage == "correctness", _show(exact)
    lossy = quality_evaluator.evaluate(c.LOSSY, incumbent=c.SLOWED)
    assert lossy.accepted, _show(lossy)  # as fast as the reference, so faster than SLOWED
    tier = lossy.tiers[0]
    assert 0 < tier.kl <= 0.01 and abs(tier.ppl_change) <= 0.02, tier
    refused = tight_quality_evaluator.evaluate(c.LOSSY, incumbent=c.SLOWED)
    assert not refused.accepted and refused.stage == "correctness", _show(refused)
    assert "KL divergence" in refused.reason
