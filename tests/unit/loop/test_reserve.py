"""The confirmation reserve sized from what confirming cost on this machine (`athanor.loop.reserve`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from athanor.errors import ConfigError
from athanor.loop.config import CompileConfig
from athanor.loop.reserve import FILE, HISTORY, MARGIN, measured_reserve, record_confirmation


@pytest.fixture(autouse=True)
def _cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("ATHANOR_CACHE", str(tmp_path))
    return tmp_path


def test_the_reserve_is_the_median_of_the_last_confirmations_with_a_margin(tmp_path: Path) -> None:
    assert measured_reserve("m|H200|bf16|32") is None
    for seconds in (300.0, 80.0, 90.0, 85.0, 200.0, 82.0):  # the first falls out of the history
        record_confirmation("m|H200|bf16|32", seconds)
    assert measured_reserve("m|H200|bf16|32") == pytest.approx(MARGIN * 85.0)
    assert measured_reserve("m|cpu|stored|30") is None  # another key: another machine or model
    assert (tmp_path / FILE).is_file() and HISTORY == 5


def test_a_corrupt_record_is_no_record(tmp_path: Path) -> None:
    (tmp_path / FILE).write_text("{not json")
    assert measured_reserve("k") is None
    record_confirmation("k", 60.0)  # and is replaced, not appended to
    assert measured_reserve("k") == pytest.approx(MARGIN * 60.0)


def test_the_config_keeps_what_confirming_costs_here_else_a_guess_within_the_budget() -> None:
    gpu = CompileConfig(model="tiny-dense", device="cuda", budget_s=480.0)
    assert gpu.reserve_s() == 120.0  # nothing measured: the device's default
    assert gpu.reserve_s(95.0) == 95.0
    assert gpu.reserve_s(400.0) == 400.0  # what it costs, not a share of the budget: the budget is a promise
    assert CompileConfig(model="tiny-dense", device="cuda", budget_s=480.0, confirm_reserve_s=60.0).reserve_s(95.0) == 60.0
    assert CompileConfig(model="tiny-dense", budget_s=60.0).reserve_s() == 45.0  # the guess leaves the search 25%
    assert gpu.smallest_budget_s(300.0) == 400.0


def test_a_budget_this_machine_cannot_confirm_in_is_refused_up_front(tmp_path: Path) -> None:
    from athanor.loop.reserve import check_budget

    config = CompileConfig(model="tiny-dense", budget_s=120.0, out_dir=tmp_path / "run")
    check_budget(config)  # nothing recorded: a guess, not a refusal
    record_confirmation(config.confirmation_key, 200.0)
    with pytest.raises(ConfigError, match=r"--budget 120s: confirming one candidate of tiny-dense on this machine "
                                          r"takes about 230 s .* the smallest workable budget here is 6m"):
        check_budget(config)
    assert not (tmp_path / "run").exists()  # nothing created
    check_budget(CompileConfig(model="tiny-dense", budget_s=360.0))
    from athanor.loop.reserve import stretched_budget

    assert stretched_budget(config).budget_s == 360.0  # asked to stretch: the smallest that works, in whole minutes
    check_budget(stretched_budget(config))
    assert stretched_budget(CompileConfig(model="tiny-dense", budget_s=600.0)).budget_s == 600.0  # enough already
