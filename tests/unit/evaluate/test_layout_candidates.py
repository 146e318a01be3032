"""A candidate that declares a parallel layout (`LAYOUT = "tp2"`) is judged like any other, in a worker group of its
layout (gloo ranks on the CPU): checked against the one-device reference, its weights checked on every rank against
the trusted reference's shards, and timed in device-seconds."""

from __future__ import annotations

from collections.abc import Iterator

import eval_candidates as c
import pytest
from eval_config import CONFIG

from athanor.engine.candidate import Candidate
from athanor.engine.config import EngineConfig
from athanor.engine.group import group_size
from athanor.errors import ConfigError
from athanor.evaluate import Evaluator
from athanor.loop.layouts import in_layout
from athanor.seams import declared_layout, with_layout

# The second rank's shard only: a digest of rank 0's weights alone would not see it.
CORRUPT_RANK_1 = Candidate.from_source(with_layout(c.corrupting("ctx.rank == 1").source, {"tp": 2}))


@pytest.fixture(scope="module")
def evaluator() -> Iterator[Evaluator]:
    with Evaluator(CONFIG) as ev:
        yield ev


def test_a_layout_runs_in_a_group_of_its_ranks_and_is_timed_in_device_seconds(evaluator: Evaluator) -> None:
    v = evaluator.evaluate(in_layout(c.BASE, "tp2"), incumbent=c.BASE)
    stages = [name for name, _ in v.stages]
    assert "correctness" in stages and "integrity" in stages and v.stage == "timing", (v.stage, v.reason)
    assert evaluator.engines("fast").challenger_devices == 2
    # Two gloo ranks of a tiny model: each step's all-reduces cost more than half the work saves, and its two
    # devices count twice: not cheaper than one device in device-seconds.
    assert v.speedup.ci_high < 1.0 and not v.accepted, v.reason
    # The one-device challenger worker is the loaded one again for the next candidate.
    assert evaluator.evaluate(c.WRONG, incumbent=c.BASE).stage == "correctness"
    assert evaluator.engines("fast").challenger_devices == 1


def test_a_rank_that_changes_its_shard_is_caught(evaluator: Evaluator) -> None:
    v = evaluator.evaluate(CORRUPT_RANK_1, incumbent=c.BASE)
    assert not v.accepted and v.stage == "integrity" and "weights" in v.reason, (v.stage, v.reason)


def test_a_layout_no_group_can_run_is_refused_in_one_line(evaluator: Evaluator) -> None:
    v = evaluator.evaluate(c.patched('LAYOUT = "tp3"\n'), incumbent=c.BASE)
    assert not v.accepted and v.stage == "smoke" and "does not divide over 3 ranks" in v.reason, v.reason
    assert "\n" not in v.reason


@pytest.mark.parametrize(("layout", "why"), [("3", "is not a layout"), ('"tp2,dp2"', "DP replicas"),
                                             ('"tp=x"', "give degrees as KEY=N")])
def test_a_declaration_that_is_no_runnable_layout_is_named(layout: str, why: str) -> None:
    source = c.patched(f"LAYOUT = {layout}\n").source
    with pytest.raises(ConfigError) as refused:
        group_size(EngineConfig(model="tiny-dense", layout=declared_layout(source, "candidate x") or {}))
    assert why in str(refused.value) and "\n" not in str(refused.value), refused.value
