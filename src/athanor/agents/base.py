"""The agent seam: what an agent sees (`AgentContext`), what it returns (`Proposal`), and the
`Agent` protocol every search agent implements.

The compile loop builds one `AgentContext` per round from the store (leaderboard, recent
verdicts, board posts) and the evaluator's profile of the incumbent; agents never call the
evaluator themselves (docs/architecture.md: agents see `evaluate` only through the store and the
board). Both types are frozen and picklable, so an agent may run in another process.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from athanor.errors import AthanorError
from athanor.store import EvaluationRecord, LeaderboardEntry, Post


class AgentError(AthanorError):
    """An agent cannot work: its endpoint is unreachable, its command is missing, its key is refused.

    The message is one line naming the agent and what to do; the loop logs it and carries on with
    the other agents.
    """


@dataclass(frozen=True)
class AgentContext:
    """Everything an agent is told about the current state of a run."""

    run_id: str
    incumbent_id: str
    """The candidate every proposal is measured against (the current best)."""
    incumbent_source: str
    """Its whole source: a module defining `build(model, ctx) -> Forward`."""
    leaderboard: tuple[LeaderboardEntry, ...] = ()
    recent_verdicts: tuple[EvaluationRecord, ...] = ()
    """The run's newest evaluations, newest first, with their stage and reason (error text)."""
    profile: str = ""
    """Where the incumbent spends its time: a torch.profiler table from the fast tier."""
    posts: tuple[Post, ...] = ()
    """The board's recent posts, oldest first."""
    model_summary: str = ""
    """The model spec in a few lines (family, layers, hidden size, heads, dtype, device)."""
    traffic_summary: str = ""
    """The traffic profile in a few lines (`TrafficProfile.summary()`)."""
    num_proposals: int = 1
    """How many proposals the loop would like this round (an agent may return fewer)."""


@dataclass(frozen=True)
class Proposal:
    """A candidate an agent offers for evaluation."""

    source: str
    parent_id: str
    """The candidate it was derived from (usually the context's incumbent)."""
    author: str
    """The proposing agent's name."""
    description: str
    """One line: what changed and why it should be faster."""

    @property
    def candidate_id(self) -> str:
        """The id the store and the engine give this source (first 16 hex digits of its sha256)."""
        return hashlib.sha256(self.source.encode()).hexdigest()[:16]


@runtime_checkable
class Agent(Protocol):
    """A search agent. The loop calls `propose` when it has evaluation budget for this agent, and
    `observe` with the verdicts of the agent's proposals once they are judged."""

    name: str
    """Unique within a run; the author recorded with its candidates."""

    def propose(self, context: AgentContext) -> list[Proposal]:
        """Up to `context.num_proposals` new candidates; may be empty. Raises AgentError only when
        the agent cannot work at all (unreachable endpoint, missing command)."""
        ...

    def observe(self, verdicts: Sequence[EvaluationRecord]) -> None:
        """Learn from evaluations (of this agent's candidates, and possibly others')."""
        ...
