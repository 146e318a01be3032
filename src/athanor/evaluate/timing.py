"""Statistics of paired timings: median speedup with a bootstrap interval, the A/A floor, the physical limit.

The engine times candidate (B) and incumbent (A) on the same step, interleaved in a random
order per step (`athanor.engine.trajectory`), so slow drifts of the machine (another process,
clock boost, thermal) hit both sides alike. The statistic is the ratio of a low quantile
(`QUANTILE`, the lower quartile) of A's and B's step times: interference from other processes
is additive and positive (on a shared 2-core machine an OS preemption adds ~4 ms to a 1 ms step
in a third of the steps), so the lower quartile estimates the undisturbed step time, while a
median of per-pair ratios is pulled around by which side happened to be preempted — and the
longer side is preempted more often, a bias toward accepting. On a GPU with graphs the two
statistics agree. The 95% interval comes from a percentile bootstrap that resamples pairs
jointly. A third run of the incumbent in every step gives the A/A interval: the noise floor
the decision must clear (see `decide`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from athanor.evaluate.verdict import Speedup

Times = Sequence[float] | np.ndarray

NUM_BOOTSTRAP = 2000
QUANTILE = 0.25


def _pairs(incumbent_s: Times, candidate_s: Times) -> tuple[np.ndarray, np.ndarray]:
    a = np.asarray(incumbent_s, dtype=np.float64)
    b = np.asarray(candidate_s, dtype=np.float64)
    if a.shape != b.shape or a.size == 0:
        raise ValueError(f"paired timings need equal, non-empty lengths (got {a.shape} and {b.shape})")
    return a, np.maximum(b, 1e-12)


def step_time(times_s: Times) -> float:
    """The undisturbed time of a step: the `QUANTILE` of its timings."""
    return float(np.quantile(np.asarray(times_s, dtype=np.float64), QUANTILE))


def bootstrap_ratios(a: np.ndarray, b: np.ndarray, seed: int = 0, num: int = NUM_BOOTSTRAP) -> np.ndarray:
    """quantile(A) / quantile(B) over `num` resamples of the pairs (with replacement)."""
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, a.size, size=(num, a.size))
    return np.quantile(a[idx], QUANTILE, axis=1) / np.quantile(b[idx], QUANTILE, axis=1)


def speedup_interval(incumbent_s: Times, candidate_s: Times, seed: int = 0) -> Speedup:
    """quantile(incumbent) / quantile(candidate) and its 95% percentile-bootstrap interval."""
    a, b = _pairs(incumbent_s, candidate_s)
    low, high = np.percentile(bootstrap_ratios(a, b, seed), [2.5, 97.5])
    return Speedup(step_time(a) / step_time(b), float(low), float(high), int(a.size))


@dataclass(frozen=True)
class ShapeTimes:
    """Paired timings of one step shape and its weight in the objective (incumbent seconds it stands for)."""

    incumbent_s: tuple[float, ...]
    candidate_s: tuple[float, ...]
    weight: float


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
    point = weights.sum() / (weights / np.array([step_time(a) / step_time(b) for a, b in pairs])).sum()
    boots = np.stack([bootstrap_ratios(a, b, seed + i) for i, (a, b) in enumerate(pairs)])  # [shapes, num]
    totals = weights.sum() / (weights[:, None] / boots).sum(axis=0)
    low, high = np.percentile(totals, [2.5, 97.5])
    return Speedup(float(point), float(low), float(high), int(min(a.size for a, _ in pairs)))


@dataclass(frozen=True)
class Decision:
    accepted: bool
    threshold: float
    reason: str


def decide(speedup: Speedup, noise: Speedup, margin: float = 0.01) -> Decision:
    """Promote only when the interval's lower bound clears 1 + margin and the A/A bias.

    The A/A median measures a systematic bias of the set-up (order or position effects): an
    incumbent "faster than itself" by x means x of any speedup may be the set-up's, so the bar
    rises by that much. Its random width is already in the candidate's own interval.
    """
    bias = max(0.0, noise.median - 1.0) if noise.num_pairs else 0.0
    threshold = 1.0 + margin + bias
    if speedup.ci_low > threshold:
        return Decision(True, threshold, f"faster: x{speedup.median:.3f} [{speedup.ci_low:.3f}, "
                                         f"{speedup.ci_high:.3f}] clears {threshold:.3f}")
    if speedup.ci_high < 1.0:
        return Decision(False, threshold, f"slower: x{speedup.median:.3f} [{speedup.ci_low:.3f}, "
                                          f"{speedup.ci_high:.3f}]")
    return Decision(False, threshold, f"not faster: x{speedup.median:.3f} [{speedup.ci_low:.3f}, "
                                      f"{speedup.ci_high:.3f}] does not clear {threshold:.3f}")


def too_noisy(noise: Speedup, max_halfwidth: float) -> bool:
    """The A/A interval is wider than `max_halfwidth` on either side: the machine was busy."""
    return noise.num_pairs > 0 and (noise.ci_high - 1.0 > max_halfwidth or 1.0 - noise.ci_low > max_halfwidth)


def physical_floor_s(bytes_moved: float, bandwidth_bytes_per_s: float) -> float:
    """The fastest a step can be: the bytes it must move at the measured bandwidth."""
    return bytes_moved / bandwidth_bytes_per_s if bandwidth_bytes_per_s > 0 else 0.0


def impossible(step_s: float, floor_s: float, slack: float = 1.25) -> bool:
    """True when `step_s` beats the physical floor by more than `slack` (a measured copy is not
    quite the peak, hence the slack; anything faster did not do the work, or hid it from the timer)."""
    return floor_s > 0 and step_s * slack < floor_s
