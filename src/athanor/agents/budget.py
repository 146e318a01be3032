"""Sharing evaluation time among agents: a cost-aware Thompson-sampling bandit on improvement per
second of evaluation.

Each agent is an arm whose unknown reward *rate* λ is improvement gained per evaluation-second.
Treating gains (in units of `gain_unit`, 1% by default) as counts observed over an exposure of
evaluation seconds gives the conjugate Gamma–Poisson model:

    λ ~ Gamma(shape = prior_gain + Σ gain / gain_unit,  rate = prior_seconds + Σ seconds)

`choose()` draws one λ per agent and gives the next evaluation to the largest draw, so an agent
gets evaluation time in proportion to the chance that it is the most productive per second. An
agent whose evaluations are slow pays for them (its exposure grows faster); one that never
improves keeps a shrinking but non-zero chance, so it is still re-tried now and then. When no
agent improves, the arm with the least exposure draws largest most often: time is shared evenly.
`discount` < 1 forgets old evidence (gains get harder as the incumbent improves).

The gain of an evaluation (`gain_of`) is log(speedup) of an accepted candidate, 0 otherwise: log
speedups add up along a lineage, so two 5% steps count as much as one 10.25% step.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from athanor.errors import ConfigError
from athanor.store import EvaluationRecord


@dataclass(frozen=True)
class BudgetConfig:
    """The bandit's prior and memory."""

    prior_gain: float = 1.0
    """Pseudo-gain (in `gain_unit`s) every agent starts with: one unit..."""
    prior_seconds: float = 60.0
    """...over this many pseudo-seconds: the prior rate is 1% per minute of evaluation."""
    gain_unit: float = 0.01
    """The gain counted as one event (0.01: a 1% speedup)."""
    discount: float = 1.0
    """Every `record` multiplies past evidence by this (1.0 keeps everything)."""
    seed: int | None = None


@dataclass(frozen=True)
class ArmStats:
    """One agent's evidence so far."""

    agent: str
    evaluations: int
    seconds: float
    gain: float
    rate: float
    """Posterior mean of gain per second."""


def gain_of(evaluation: EvaluationRecord) -> float:
    """Improvement an evaluation brought: log of an accepted candidate's speedup, else 0."""
    if not evaluation.accepted or not math.isfinite(evaluation.speedup) or evaluation.speedup <= 1.0:
        return 0.0
    return math.log(evaluation.speedup)


class BudgetAllocator:
    """Chooses which agent's proposal gets the next evaluation."""

    def __init__(self, agents: Sequence[str], config: BudgetConfig | None = None) -> None:
        if not agents:
            raise ConfigError("--agents: the budget needs at least one agent")
        self.config = config or BudgetConfig()
        self.agents = list(dict.fromkeys(agents))
        self._rng = np.random.default_rng(self.config.seed)
        self._gain = dict.fromkeys(self.agents, 0.0)
        self._seconds = dict.fromkeys(self.agents, 0.0)
        self._count = dict.fromkeys(self.agents, 0)

    def _posterior(self, agent: str) -> tuple[float, float]:
        c = self.config
        return c.prior_gain + self._gain[agent] / c.gain_unit, c.prior_seconds + self._seconds[agent]

    def choose(self, available: Sequence[str] | None = None) -> str:
        """The agent to evaluate next, among `available` (agents with proposals waiting; default all)."""
        names = [a for a in (available if available is not None else self.agents) if a in self._gain]
        if not names:
            raise ValueError(f"none of {list(available or [])} is a budgeted agent ({', '.join(self.agents)})")
        draws = [self._rng.gamma(shape, 1.0 / rate) for shape, rate in map(self._posterior, names)]
        return names[int(np.argmax(draws))]

    def record(self, agent: str, seconds: float, gain: float) -> None:
        """Charge `seconds` of evaluation to `agent`, which improved the objective by `gain`."""
        if agent not in self._gain:
            raise ValueError(f"{agent!r} is not a budgeted agent ({', '.join(self.agents)})")
        if self.config.discount < 1.0:
            for name in self.agents:
                self._gain[name] *= self.config.discount
                self._seconds[name] *= self.config.discount
        self._gain[agent] += max(0.0, gain)
        self._seconds[agent] += max(0.0, seconds)
        self._count[agent] += 1

    def record_evaluation(self, evaluation: EvaluationRecord) -> None:
        """`record` an evaluation from the store, charged to its candidate's author."""
        self.record(evaluation.author, evaluation.wall_s, gain_of(evaluation))

    def shares(self, num_samples: int = 4000) -> dict[str, float]:
        """The chance each agent gets the next evaluation (Monte Carlo over the posteriors)."""
        draws = np.stack([self._rng.gamma(shape, 1.0 / rate, size=num_samples)
                          for shape, rate in map(self._posterior, self.agents)])
        wins = np.bincount(draws.argmax(axis=0), minlength=len(self.agents))
        return {a: float(w) / num_samples for a, w in zip(self.agents, wins)}

    def stats(self) -> list[ArmStats]:
        out = []
        for agent in self.agents:
            shape, rate = self._posterior(agent)
            out.append(ArmStats(agent, self._count[agent], self._seconds[agent], self._gain[agent],
                                shape * self.config.gain_unit / rate))
        return out
