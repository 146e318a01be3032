"""Evaluators shared by the evaluate tests: tiny-dense on CPU, engines kept across evaluations."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from athanor.evaluate import EvaluateConfig, Evaluator, StageTimeouts
from athanor.evaluate.correctness import QualityBudget

CONFIG = EvaluateConfig(model="tiny-dense", max_seqs=4, max_seq_len=96, decode_pairs=64, prefill_pairs=48,
                        timing_budget_s=0.3,
                        fast_layers=2, timeouts=StageTimeouts(start_s=120, swap_s=60, smoke_s=30, check_s=60,
                                                              timing_s=60))


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
