"""The compile loop's test doubles: a planted agent (given sources, in order, then nothing more), a budget clock that
moves when told, and a stand-in evaluator that judges at once."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from types import SimpleNamespace
from typing import Any

from athanor.agents.base import AgentContext, Proposal
from athanor.engine.candidate import Candidate
from athanor.evaluate import Speedup, Verdict
from athanor.store import EvaluationRecord


class PlantedAgent:
    """Proposes its candidates one per round, each derived from the round's incumbent; then nothing new, which
    stops it (so a run's length is its number of candidates, not a time budget)."""

    name = "planted"

    def __init__(self, candidates: Sequence[Candidate]) -> None:
        self.waiting = list(candidates)
        self.observed: list[EvaluationRecord] = []

    def propose(self, context: AgentContext) -> list[Proposal]:
        if not self.waiting:
            return []
        cand = self.waiting.pop(0)
        return [Proposal(source=cand.source, parent_id=context.incumbent_id, author=self.name,
                         description=cand.manifest.description)]

    def observe(self, verdicts: Sequence[EvaluationRecord]) -> None:
        self.observed.extend(verdicts)


class Clock:
    """A budget clock that moves only when told to (`Session(clock=...)`)."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def refused(candidate: Candidate, incumbent: Candidate) -> Verdict:
    """A stand-in verdict: wrong outputs (never timed, never confirmed)."""
    return Verdict(candidate.id, incumbent.id, accepted=False, stage="correctness", reason="stand-in", wall_s=1.0)


def slower(candidate: Candidate, incumbent: Candidate) -> Verdict:
    """A stand-in verdict: timed, and slower than the incumbent (not worth confirming)."""
    return Verdict(candidate.id, incumbent.id, accepted=False, stage="timing", reason="stand-in: slower",
                   speedup=Speedup(0.9, 0.85, 0.95, 16), gpu_s_per_1k_requests=2.0, incumbent_gpu_s_per_1k_requests=1.8,
                   wall_s=1.0, stages=(("static", 0.1), ("timing", 0.9)))


class StandInEvaluator:
    """An evaluator that judges at once, without engines: `verdict(candidate, incumbent)`, after moving `clock` on
    by `cost_s`. For the loop's bookkeeping (what ends it, what it stores and resumes), not for judging: the
    evaluator's own tests and the loop's one real session (test_compile.py) judge for real."""

    def __init__(self, config: Any = None, *, verdict: Callable[[Candidate, Candidate], Verdict] = refused,
                 clock: Clock | None = None, cost_s: float = 0.0) -> None:
        self.config = config if config is not None else SimpleNamespace(margin=0.01)
        self.verdict, self.clock, self.cost_s = verdict, clock, cost_s
        self.judged: list[str] = []

    def evaluate(self, candidate: Candidate, incumbent: Candidate) -> Verdict:
        if self.clock is not None:
            self.clock.now += self.cost_s
        self.judged.append(candidate.id)
        return self.verdict(candidate, incumbent)

    def close(self) -> None:
        pass
