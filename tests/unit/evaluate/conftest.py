"""Evaluators shared by the evaluate tests: tiny-dense on CPU, engines kept across evaluations."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from eval_config import CONFIG

from athanor.evaluate import Evaluator
from athanor.evaluate.correctness import QualityBudget


@pytest.fixture(scope="session")
def evaluator() -> Iterator[Evaluator]:
    with Evaluator(CONFIG) as ev:
        yield ev


@pytest.fixture(scope="session")
def runtime_evaluator() -> Iterator[Evaluator]:
    """Static checks off: each runtime defence must stand on its own."""
    yield from _evaluator(static_checks=False)


def _evaluator(**changes: object) -> Iterator[Evaluator]:
    import dataclasses

    with Evaluator(dataclasses.replace(CONFIG, **changes)) as ev:  # type: ignore[arg-type]
        yield ev


@pytest.fixture(scope="module")
def bitwise_evaluator() -> Iterator[Evaluator]:
    yield from _evaluator(bitwise=True)


@pytest.fixture(scope="module")
def quality_evaluator() -> Iterator[Evaluator]:
    yield from _evaluator(quality=QualityBudget(max_kl=0.01, max_ppl_increase=0.02))


@pytest.fixture(scope="module")
def tight_quality_evaluator() -> Iterator[Evaluator]:
    yield from _evaluator(quality=QualityBudget(max_kl=1e-9, max_ppl_increase=0.02))
