"""Agent fixtures: a store with a run and a context around the toy incumbent."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from toy_candidate import INCUMBENT

from athanor.agents import AgentContext, Board
from athanor.store import Store, open_store


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    with open_store(tmp_path) as s:
        yield s


@pytest.fixture
def run_id(store: Store) -> str:
    return store.add_run("smollm2-135m", "preset:chat", "cpu", run_id="test-run").id


@pytest.fixture
def board(store: Store, run_id: str) -> Board:
    return Board(store, run_id)


@pytest.fixture
def context(store: Store, run_id: str) -> AgentContext:
    incumbent = store.add_candidate(run_id, INCUMBENT, author="baseline", description="the reference forward")
    return AgentContext(run_id=run_id, incumbent_id=incumbent.id, incumbent_source=INCUMBENT,
                        profile="aten::mm  61.2%\naten::add  9.8%", model_summary="llama, 30 layers, hidden 576",
                        traffic_summary="chat: prompt p50 512, output p50 256")
