"""The confirmation reserve sized from what confirming cost on this machine (`athanor.loop.reserve`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from athanor.loop.config import MAX_RESERVE_SHARE, CompileConfig
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


def test_the_config_takes_the_measured_reserve_within_its_cap() -> None:
    gpu = CompileConfig(model="tiny-dense", device="cuda", budget_s=480.0)
    assert gpu.reserve_s() == 120.0  # nothing measured: the device's default
    assert gpu.reserve_s(95.0) == 95.0
    assert gpu.reserve_s(400.0) == 0.4 * 480.0 == MAX_RESERVE_SHARE * 480.0  # never more than 40% of the budget
    assert CompileConfig(model="tiny-dense", device="cuda", budget_s=480.0, confirm_reserve_s=60.0).reserve_s(95.0) == 60.0
    assert CompileConfig(model="tiny-dense", budget_s=180.0).reserve_s(225.0) == 72.0  # a 2-core CPU's smollm2
