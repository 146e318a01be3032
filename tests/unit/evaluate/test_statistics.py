"""Paired statistics, the decision rule and the physical limit, on synthetic timings."""

from __future__ import annotations

import dataclasses

import numpy as np

from athanor.evaluate.timing import (
    ShapeTimes,
    decide,
    impossible,
    is_paired,
    objective_speedup,
    pairs_for_budget,
    physical_floor_s,
    repeatability,
    robust_cv,
    speedup_interval,
    too_noisy,
    worth_confirming,
)
from athanor.evaluate.verdict import Speedup, TierResult, Verdict


def _noisy(n: int, seed: int, scale: float = 1.0) -> np.ndarray:
    """Step times on a shared machine: mild drift, jitter, and preemptions adding 3x a step to 30% of them."""
    rng = np.random.default_rng(seed)
    drift = 1 + 0.05 * np.sin(np.arange(n) / 7)
    spikes = 3.0 * (rng.random(n) < 0.3)
    return scale * (drift * (1 + 0.01 * rng.standard_normal(n)) + spikes)


def test_equal_timings_interval_contains_one() -> None:
    s = speedup_interval(_noisy(80, 0), _noisy(80, 1))
    assert s.contains_one() and s.ci_high - s.ci_low < 0.05


def test_faster_candidate_interval_excludes_one() -> None:
    s = speedup_interval(_noisy(80, 0), _noisy(80, 1, scale=0.8))
    assert 1.15 < s.ci_low < 1.25 < s.ci_high < 1.35


def test_decide_needs_margin_and_bias() -> None:
    aa = Speedup(1.0, 0.99, 1.01, 50)
    assert decide(Speedup(1.05, 1.02, 1.08, 50), aa).accepted
    assert not decide(Speedup(1.02, 1.005, 1.03, 50), aa).accepted  # below 1 + 1%
    biased = Speedup(1.03, 1.01, 1.05, 50)  # the set-up favours whoever runs second by 3%
    assert not decide(Speedup(1.05, 1.035, 1.07, 50), biased).accepted
    assert "slower" in decide(Speedup(0.8, 0.78, 0.82, 50), aa).reason


def _fast_verdict(speedup: Speedup, noise: Speedup, stage: str = "timing", status: str = "rejected") -> Verdict:
    decision = decide(speedup, noise)
    tier = TierResult(tier="fast", num_layers=6, speedup=speedup, noise=noise)
    return Verdict(candidate_id="c", incumbent_id="i", accepted=decision.accepted, stage=stage, reason=decision.reason,
                   status="accepted" if decision.accepted else status, speedup=speedup, tiers=(tier,))


def test_the_fast_tier_screen_forwards_a_median_over_the_bar_and_nothing_weaker() -> None:
    aa = Speedup(1.0, 0.99, 1.01, 50)
    assert worth_confirming(_fast_verdict(Speedup(1.05, 1.02, 1.08, 50), aa))  # accepted
    wide = _fast_verdict(Speedup(1.086, 1.023, 1.131, 16), Speedup(1.02, 0.97, 1.06, 16))  # the CPU demo's
    assert not wide.accepted and worth_confirming(wide)  # bar 1.03: the interval does not clear it, the median does
    assert not worth_confirming(_fast_verdict(Speedup(1.008, 0.97, 1.05, 16), aa))  # median under 1 + 1%
    biased = Speedup(1.03, 1.01, 1.05, 50)
    assert not worth_confirming(_fast_verdict(Speedup(1.035, 0.99, 1.08, 50), biased))  # under the raised bar
    too_noisy_verdict = _fast_verdict(Speedup(1.2, 0.9, 1.5, 16), aa, status="error")
    assert not worth_confirming(too_noisy_verdict)  # an evaluation that could not judge is not forwarded
    wrong = _fast_verdict(Speedup(1.2, 1.1, 1.3, 16), aa, stage="correctness")
    assert not worth_confirming(dataclasses.replace(wrong, accepted=False, status="rejected"))


def test_objective_weights_shapes() -> None:
    fast = ShapeTimes(tuple(_noisy(60, 0)), tuple(_noisy(60, 1, 0.5)), weight=9.0)
    same = ShapeTimes(tuple(_noisy(60, 2)), tuple(_noisy(60, 3)), weight=1.0)
    s = objective_speedup([fast, same])
    assert abs(s.median - 10 / (9 / 2 + 1)) < 0.05  # 1.82
    assert s.ci_low < s.median < s.ci_high


def test_too_noisy() -> None:
    assert too_noisy(Speedup(1.0, 0.85, 1.2, 40), 0.1)
    assert not too_noisy(Speedup(1.0, 0.97, 1.03, 40), 0.1)


def test_impossibly_fast_is_refused() -> None:
    floor = physical_floor_s(bytes_moved=2.4e9, bandwidth_bytes_per_s=4.0e12)  # 1B bf16 weights on an H200
    assert abs(floor - 0.6e-3) < 1e-9
    assert impossible(0.2e-3, floor)  # "3x faster than reading the weights once"
    assert not impossible(0.7e-3, floor)
    assert not impossible(0.55e-3, floor)  # within the slack: a copy benchmark is not the peak


# -- which statistic, and why ---------------------------------------------------------------------------
def _stepwise(n: int, seed: int, noise: float, spread: float = 0.25) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """GPU-like timings: each step's own time (context, chunk length) varies by `spread`, and the three runs
    of a step (A, B, A') repeat within `noise` (symmetric, no spikes)."""
    rng = np.random.default_rng(seed)
    step = 1e-3 * (1 + spread * rng.random(n))
    return tuple(step * (1 + noise * rng.standard_normal(n)) for _ in range(3))  # type: ignore[return-value]


def test_step_correlated_times_use_the_pairs() -> None:
    # The H200 failure: 32 pairs of steps of different lengths, 1.5% run-to-run noise. The quartile of the
    # pooled times lands on one or two steps, so its interval is as wide as one pair's noise.
    widths = {True: [], False: []}
    for seed in range(20):
        a, _, c = _stepwise(32, seed, 0.015)
        assert is_paired(a, c)
        for paired in (True, False):
            s = speedup_interval(a, c, paired=paired)
            widths[paired].append(max(s.ci_high - 1, 1 - s.ci_low))
    assert np.median(widths[True]) < 0.6 * np.median(widths[False])
    assert max(widths[True]) < 0.02


def test_independent_spikes_use_the_quartiles() -> None:
    a, c = _noisy(400, 0), _noisy(400, 1)
    assert not is_paired(a, c)  # preemptions are independent of the step: the pairs carry no information
    s = speedup_interval(a, c, paired=False)
    assert s.contains_one() and s.ci_high - s.ci_low < 0.03


def test_paired_statistic_finds_a_uniform_speedup() -> None:
    a, b, _ = _stepwise(200, 3, 0.005)
    s = speedup_interval(a, b * 0.8, paired=True)
    assert 1.24 < s.ci_low < 1.25 < s.ci_high < 1.26


def test_objective_uses_each_shapes_statistic() -> None:
    a, b, c = _stepwise(100, 4, 0.005)
    shape = ShapeTimes(tuple(a), tuple(b * 0.5), weight=1.0, paired=True)
    s = objective_speedup([shape])
    assert 1.98 < s.ci_low < s.median < s.ci_high < 2.02
    aa = objective_speedup([ShapeTimes(tuple(a), tuple(c), weight=1.0, paired=True)])
    assert 0.995 < aa.ci_low <= 1.0 <= aa.ci_high < 1.005


def test_pairs_for_budget() -> None:
    first = np.full((3, 64), 1e-3)  # 1 ms steps, three sides
    assert pairs_for_budget(first, 1.0, 64, 1000) == 333
    assert pairs_for_budget(first, 0.01, 64, 1000) == 64  # never fewer than the minimum
    assert pairs_for_budget(first, 100.0, 64, 1000) == 1000
    assert pairs_for_budget(np.full((3, 8), 0.5), 1.0, 24, 1000) == 24  # a slow step: the minimum


def test_spread_figures() -> None:
    a, _, c = _stepwise(400, 5, 0.01, spread=0.0)
    assert 0.008 < robust_cv(a) < 0.012
    assert 0.008 < repeatability(a, c) < 0.012
    a, _, c = _stepwise(400, 6, 0.01, spread=0.5)
    assert robust_cv(a) > 0.1 and repeatability(a, c) < 0.012  # the steps' differences are not run-to-run noise


def test_a_noisy_machine_gets_more_pairs_not_a_fresh_start() -> None:
    """Each attempt alone leaves the A/A interval wider than ±10%; their pairs pooled do not, so the tier is
    judged on both attempts' pairs. With one attempt the same first pairs are "too noisy to judge"."""
    from types import SimpleNamespace

    import pytest

    from athanor.evaluate import EvaluateConfig, Evaluator
    from athanor.evaluate.objective import StepShape
    from athanor.evaluate.progress import Rejected

    rng = np.random.default_rng(34)

    def attempt() -> np.ndarray:  # [incumbent, candidate, twin] x 10 pairs at a cv of 12%
        a, b, c = (scale * 1e-3 * (1 + 0.12 * rng.standard_normal(10)) for scale in (1.0, 0.7, 1.0))
        return np.stack([a, b, c])

    engines = SimpleNamespace(num_layers=2, bandwidth=1e12, challenger_devices=1)
    evaluator = Evaluator(EvaluateConfig(model="tiny-dense", max_attempts=2))
    shapes = 3  # the tiny preset's chosen shapes: two decode, one prefill
    first, second = [attempt() for _ in range(shapes)], [attempt() for _ in range(shapes)]
    served = iter(first + second)
    evaluator._timed_shape = lambda *args: next(served)  # type: ignore[method-assign]
    pooled = evaluator._time("fast", engines, (), None, 0, "timing")  # type: ignore[arg-type]
    assert not too_noisy(pooled.noise, 0.10)
    assert next(served, None) is None  # both attempts were timed
    timed = [StepShape(m.kind, m.batch_size, m.tokens, m.context_len) for m in pooled.measurements]
    for alone in (first, second):
        times = {shape: (t[0], t[1], t[2]) for shape, t in zip(timed, alone, strict=True)}
        assert too_noisy(evaluator._figures("fast", times, 2, 2, 1e12).noise, 0.10)

    served = iter(first)
    once = Evaluator(EvaluateConfig(model="tiny-dense", max_attempts=1))
    once._timed_shape = lambda *args: next(served)  # type: ignore[method-assign]
    with pytest.raises(Rejected, match="too noisy to judge"):
        once._time("fast", engines, (), None, 0, "timing")  # type: ignore[arg-type]
