"""Shared fixtures: one engine worker (tiny-dense on CPU) per test module, and candidate sources."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from engine_candidates import CONFIG

from athanor.engine.candidate import baseline_candidate
from athanor.engine.supervisor import Supervisor, Timeouts


@pytest.fixture(scope="module")
def engine() -> Iterator[Supervisor]:
    sup = Supervisor(CONFIG, Timeouts(start_s=120, swap_s=60, run_s=30, other_s=30))
    sup.start()
    yield sup
    sup.close()


@pytest.fixture
def fresh(engine: Supervisor) -> Supervisor:
    """The shared engine with the baseline as the only resident candidate."""
    reply = engine.swap(baseline_candidate())
    assert reply.status == "ok", reply.error
    return engine
