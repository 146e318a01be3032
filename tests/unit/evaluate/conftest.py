"""Evaluators shared by the evaluate tests: tiny-dense on CPU, engines kept across evaluations."""

from __future__ import annotations

import dataclasses
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
    """Static checks off: each runtime defence must stand on its own. Engines of its own: the cheats it meets
    leave their workers to be restarted, which the other tests' engines need not pay for."""
    with Evaluator(dataclasses.replace(CONFIG, static_checks=False)) as ev:
        yield ev


@pytest.fixture(scope="session")
def bitwise_evaluator(evaluator: Evaluator) -> Evaluator:
    return evaluator.with_checks(bitwise=True)


@pytest.fixture(scope="session")
def quality_evaluator(evaluator: Evaluator) -> Evaluator:
    return evaluator.with_checks(quality=QualityBudget(max_kl=0.01, max_ppl_increase=0.02))


@pytest.fixture(scope="session")
def tight_quality_evaluator(evaluator: Evaluator) -> Evaluator:
    return evaluator.with_checks(quality=QualityBudget(max_kl=1e-9, max_ppl_increase=0.02))
