"""Fixtures of the compile loop's tests: a planted agent registered for one test, a cache directory of a test's own."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from loop_doubles import PlantedAgent

from athanor.agents.registry import AGENT_FACTORIES
from athanor.engine.candidate import Candidate
from athanor.settings import CACHE, cache_dir


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
