"""A planted agent for the compile loop's tests: it proposes given sources, in order, then nothing more."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

from athanor.agents.base import AgentContext, Proposal
from athanor.agents.registry import AGENT_FACTORIES
from athanor.engine.candidate import Candidate
from athanor.settings import CACHE, cache_dir
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


@pytest.fixture
def plant(monkeypatch: pytest.MonkeyPatch) -> Callable[..., PlantedAgent]:
    """`plant(*candidates)`: `--agents planted` proposes these candidates (registered for this test only)."""

    def register(*candidates: Candidate) -> PlantedAgent:
        agent = PlantedAgent(candidates)
        monkeypatch.setitem(AGENT_FACTORIES, "planted", lambda config, board: agent)
        return agent

    return register


@pytest.fixture
def cost_records(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, smollm2_gguf: Path) -> Path:
    """A cache directory of this test's own for what runs record (the confirmations' cost), sharing the machine's
    models (the workload's tokenizer is smollm2's: no second download) and device locks."""
    machine = cache_dir()
    private = tmp_path / "cache"
    private.mkdir()
    for shared in ("models", "locks"):
        (machine / shared).mkdir(parents=True, exist_ok=True)
        (private / shared).symlink_to(machine / shared, target_is_directory=True)
    monkeypatch.setenv(CACHE, str(private))
    return private
