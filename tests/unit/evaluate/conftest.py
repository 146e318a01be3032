"""Evaluators shared by the evaluate tests: tiny-dense on CPU, engines kept across evaluations."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from athanor.evaluate import EvaluateConfig, Evaluator, StageTimeouts

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
    import dataclasses

    with Evaluator(dataclasses.replace(CONFIG, static_checks=False)) as ev:
        yield ev
