"""Paired statistics, the decision rule and the physical limit, on synthetic timings."""

from __future__ import annotations

import numpy as np

from athanor.evaluate.timing import (
    ShapeTimes,
    decide,
    impossible,
    objective_speedup,
    physical_floor_s,
    speedup_interval,
    too_noisy,
)
from athanor.evaluate.verdict import Speedup


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
