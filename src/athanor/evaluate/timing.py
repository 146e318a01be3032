"""Statistics of paired timings: a speedup with a bootstrap interval, the A/A floor, the physical limit.

The engine times candidate (B) and incumbent (A) on the same step, interleaved in a random
order per step (`athanor.engine.trajectory`), and the incumbent a second time (A') for the A/A
floor. Two kinds of noise call for two statistics, and the data say which one it has:

- **Independent, one-sided noise** (a shared CPU): an OS preemption adds several step times to
  some of the runs, whichever side runs, and the two runs of a step are uncorrelated. The
  lower quartile of each side's times estimates the undisturbed step time; the statistic is
  quartile(A) / quartile(B). A per-pair ratio would mix the spikes of both sides into every pair
  and widen the interval.
- **Step-correlated, small, symmetric noise** (a GPU): a decode step's time follows its context
  length, a prefill's its chunk length, while runs of the same step repeat within a fraction of
  a percent. A quantile of the pooled times then lands on one or two steps, and its interval is
  as wide as one pair's noise however many pairs there are; the statistic is the median of the
  per-pair log-ratios log(A_i / B_i), which cancels the step's own time.

`is_paired` picks per shape from the incumbent's two runs: when their rank correlation across
steps is at least `PAIRED_CORRELATION`, the step explains the times and the pairs are used. The
candidate cannot steer the choice (it is made from the incumbent's runs alone), and both
statistics estimate the same ratio when the speedup is the same on every step. The 95% interval
is a percentile bootstrap that resamples pairs jointly (a step's A and B stay together).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy.stats import spearmanr

from athanor.evaluate.verdict import Speedup, Verdict

log = logging.getLogger(__name__)

Times = Sequence[float] | np.ndarray

NUM_BOOTSTRAP = 2000
QUANTILE = 0.25
PAIRED_CORRELATION = 0.5
"""Rank correlation of the incumbent's two runs across steps from which the per-pair statistic is used."""


def _pairs(incumbent_s: Times, candidate_s: Times) -> tuple[np.ndarray, np.ndarray]:
    a = np.asarray(incumbent_s, dtype=np.float64)
    b = np.asarray(candidate_s, dtype=np.float64)
    if a.shape != b.shape or a.size == 0:
        raise ValueError(f"paired timings need equal, non-empty lengths (got {a.shape} and {b.shape})")
    return np.maximum(a, 1e-12), np.maximum(b, 1e-12)


def pairs_for_budget(first: np.ndarray, budget_s: float, min_pairs: int, max_pairs: int) -> int:
    """Timed steps per shape so that all sides' runs take about `budget_s`, from a first measurement
    `first` [sides, steps] (its median run), within [min_pairs, max_pairs]."""
    run_s = float(np.median(first)) if first.size else 0.0
    want = int(budget_s / (first.shape[0] * run_s)) if run_s > 0 and budget_s > 0 else 0
    return max(min_pairs, min(max_pairs, want))


def next_round_pairs(chunks: Sequence[np.ndarray], first: int, *, budget_s: float, max_pairs: int,
                     precision: float, max_budget_factor: float) -> int:
    """Pairs of a timed shape's next round, 0 when it is done; `chunks` are its rounds so far
    ([sides, pairs] each: incumbent, candidate, incumbent's twin), the first of `first` pairs.

    After the first round, as many more as `budget_s` holds at the step time it measured; then, while
    the shape's A/A interval is wider than `precision`, further rounds up to `max_budget_factor` times
    the budget. Sequential sampling on the incumbent's runs alone, which the candidate cannot steer."""
    times = np.concatenate(list(chunks), axis=1)
    done, spent = times.shape[1], float(times.sum())
    worth = max(8, first // 2)  # a round too small to move the interval is not worth its set-up and checks
    if len(chunks) == 1:
        budgeted = pairs_for_budget(chunks[0], budget_s, first, max_pairs) - done
        if budgeted >= worth:
            return budgeted
    a, c = times[0], times[2]
    aa = speedup_interval(a, c, is_paired(a, c))
    if max(aa.ci_high - 1.0, 1.0 - aa.ci_low) <= precision:
        return 0
    left_s = max_budget_factor * budget_s - spent
    more = min(done, max_pairs - done, int(left_s / (spent / done)))
    if more < worth:
        return 0
    log.info("A/A interval of this shape [%.3f, %.3f] is wider than ±%.1f%%: %d more pairs",
             aa.ci_low, aa.ci_high, 100 * precision, more)
    return more


def step_time(times_s: Times) -> float:
    """The undisturbed time of a step: the `QUANTILE` of its timings."""
    return float(np.quantile(np.asarray(times_s, dtype=np.float64), QUANTILE))


def robust_cv(times_s: Times) -> float:
    """Spread of one side's step times: 1.4826 MAD / median (a standard deviation for normal noise,
    blind to the spikes of a shared machine). It includes the steps' own differences (context and
    chunk lengths); `repeatability` is the run-to-run part alone."""
    x = np.asarray(times_s, dtype=np.float64)
    if x.size == 0:
        return float("nan")
    med = float(np.median(x))
    return 1.4826 * float(np.median(np.abs(x - med))) / med if med > 0 else float("nan")


def repeatability(first_s: Times, second_s: Times) -> float:
    """Run-to-run spread of one side measured twice on the same steps (A and A'): robust standard
    deviation of log(A_i / A'_i) / sqrt(2)."""
    a, c = _pairs(first_s, second_s)
    lr = np.log(a / c)
    return 1.4826 * float(np.median(np.abs(lr - np.median(lr)))) / np.sqrt(2)


def is_paired(first_s: Times, second_s: Times) -> bool:
    """Whether the incumbent's two runs of each step agree across steps (Spearman correlation at least
    `PAIRED_CORRELATION`): the step explains the times, so the per-pair statistic is the precise one."""
    a, c = _pairs(first_s, second_s)
    if a.size < 8 or np.ptp(a) == 0 or np.ptp(c) == 0:
        return False
    return float(spearmanr(a, c).statistic) >= PAIRED_CORRELATION


def _statistic(a: np.ndarray, b: np.ndarray, paired: bool) -> np.ndarray:
    """Speedup A/B over the last axis (pairs): exp(median log(A_i / B_i)), or quartile(A) / quartile(B)."""
    if paired:
        return np.exp(np.median(np.log(a / b), axis=-1))
    return np.quantile(a, QUANTILE, axis=-1) / np.quantile(b, QUANTILE, axis=-1)


def bootstrap_ratios(a: np.ndarray, b: np.ndarray, paired: bool = False, seed: int = 0,
                     num: int = NUM_BOOTSTRAP) -> np.ndarray:
    """The statistic over `num` resamples of the pairs (with replacement, A_i and B_i together)."""
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, a.size, size=(num, a.size))
    return _statistic(a[idx], b[idx], paired)


def speedup_interval(incumbent_s: Times, candidate_s: Times, paired: bool = False, seed: int = 0) -> Speedup:
    """incumbent / candidate (see the module docstring for `paired`) and its 95% percentile-bootstrap
    interval."""
    a, b = _pairs(incumbent_s, candidate_s)
    low, high = np.percentile(bootstrap_ratios(a, b, paired, seed), [2.5, 97.5])
    return Speedup(float(_statistic(a, b, paired)), float(low), float(high), int(a.size))


def slowdown_low(now_s: np.ndarray, before_s: np.ndarray, seed: int = 0, num: int = NUM_BOOTSTRAP) -> float:
    """The 2.5th percentile of quartile(now) / quartile(before) over independent resamples of each: how much slower
    `now` is at least (two sets of step times of one resident, measured apart, so not paired)."""
    rng = np.random.default_rng(seed)
    a = now_s[rng.integers(0, now_s.size, size=(num, now_s.size))]
    b = before_s[rng.integers(0, before_s.size, size=(num, before_s.size))]
    return float(np.percentile(np.quantile(a, QUANTILE, axis=-1) / np.quantile(b, QUANTILE, axis=-1), 2.5))


@dataclass(frozen=True)
class ShapeTimes:
    """Paired timings of one step shape and its weight in the objective (incumbent seconds it stands for)."""

    incumbent_s: tuple[float, ...]
    candidate_s: tuple[float, ...]
    weight: float
    paired: bool = False
    """Use the per-pair statistic (`is_paired` of the incumbent's two runs)."""


def objective_speedup(shapes: Sequence[ShapeTimes], seed: int = 0) -> Speedup:
    """Speedup of the weighted total time: sum w / sum (w / r_s), r_s each shape's speedup.

    `w` is the incumbent's time each shape stands for in the workload, so the result is the
    ratio of projected GPU-seconds; the interval resamples pairs within every shape at once.
    """
    shapes = [s for s in shapes if s.weight > 0]
    if not shapes:
        return Speedup()
    weights = np.array([s.weight for s in shapes])
    pairs = [_pairs(s.incumbent_s, s.candidate_s) for s in shapes]
    ratios = np.array([float(_statistic(a, b, s.paired)) for s, (a, b) in zip(shapes, pairs, strict=True)])
    point = weights.sum() / (weights / ratios).sum()
    boots = np.stack([bootstrap_ratios(a, b, s.paired, seed + i)
                      for i, (s, (a, b)) in enumerate(zip(shapes, pairs, strict=True))])  # [shapes, num]
    totals = weights.sum() / (weights[:, None] / boots).sum(axis=0)
    low, high = np.percentile(totals, [2.5, 97.5])
    return Speedup(float(point), float(low), float(high), int(min(a.size for a, _ in pairs)))


@dataclass(frozen=True)
class Decision:
    accepted: bool
    threshold: float
    reason: str


def bar(noise: Speedup, margin: float = 0.01) -> float:
    """The speedup a candidate must beat: 1 + margin + the A/A bias.

    The A/A median measures a systematic bias of the set-up (order or position effects): an
    incumbent "faster than itself" by x means x of any speedup may be the set-up's, so the bar
    rises by that much. Its random width is already in the candidate's own interval.
    """
    return 1.0 + margin + (max(0.0, noise.median - 1.0) if noise.num_pairs else 0.0)


def decide(speedup: Speedup, noise: Speedup, margin: float = 0.01) -> Decision:
    """Promote only when the interval's lower bound clears the `bar`."""
    threshold = bar(noise, margin)
    if speedup.ci_low > threshold:
        return Decision(True, threshold, f"faster: x{speedup.median:.3f} [{speedup.ci_low:.3f}, "
                                         f"{speedup.ci_high:.3f}] clears {threshold:.3f}")
    if speedup.ci_high < 1.0:
        return Decision(False, threshold, f"slower: x{speedup.median:.3f} [{speedup.ci_low:.3f}, "
                                          f"{speedup.ci_high:.3f}]")
    return Decision(False, threshold, f"not faster: x{speedup.median:.3f} [{speedup.ci_low:.3f}, "
                                      f"{speedup.ci_high:.3f}] does not clear {threshold:.3f}")


def too_noisy(noise: Speedup, max_halfwidth: float) -> bool:
    """The A/A interval is wider than `max_halfwidth` on either side: the machine is too noisy to judge on."""
    return noise.num_pairs > 0 and (noise.ci_high - 1.0 > max_halfwidth or 1.0 - noise.ci_low > max_halfwidth)


def physical_floor_s(bytes_moved: float, bandwidth_bytes_per_s: float) -> float:
    """The fastest a step can be: the bytes it must move at the measured bandwidth."""
    return bytes_moved / bandwidth_bytes_per_s if bandwidth_bytes_per_s > 0 else 0.0


def impossible(step_s: float, floor_s: float, slack: float = 1.25) -> bool:
    """True when `step_s` beats the physical floor by more than `slack` (a measured copy is not
    quite the peak, hence the slack; anything faster did not do the work, or hid it from the timer)."""
    return floor_s > 0 and step_s * slack < floor_s


def worth_confirming(verdict: Verdict, margin: float = 0.01) -> bool:
    """Whether a fast-tier verdict earns the slow tier's time: accepted, or rejected at timing with a
    median that clears the bar its interval did not.

    The fast tier is a screen and the slow tier the proof. A screen that demanded its own interval clear
    the bar would drop real winners: on a CPU the fast tier's interval (a fifth of the layers, few pairs)
    is wider than a real speedup. The slow tier's interval still decides what wins.
    """
    if verdict.accepted:
        return True
    if verdict.status != "rejected" or verdict.stage != "timing" or not verdict.tiers:
        return False
    last = verdict.tiers[-1]
    return last.speedup.median > bar(last.noise, margin)
