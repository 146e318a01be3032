"""`athanor bench decode` on the CPU: a record with its timing, and the windows after it."""

from __future__ import annotations

import pytest

from athanor.errors import ConfigError
from athanor.model.presets import get_preset
from athanor.model.random_init import random_model
from athanor.moves.decode_bench import bench_decode


def test_a_cell_times_the_captured_step_and_its_windows_after_it() -> None:
    model = random_model(get_preset("tiny-dense"), seed=1)
    record = bench_decode("tiny-dense", 2, 16, candidate="best", device="cpu", dtype="float32", iters=3,
                          min_time_s=0.0, model=model, windows=3)
    assert record["status"] == "ok" and record["ms_per_token"] > 0
    assert len(record["window_ms"]) == 3 and all(ms > 0 for ms in record["window_ms"])
    assert "window_ms" not in bench_decode("tiny-dense", 1, 8, device="cpu", dtype="float32", iters=2,
                                           min_time_s=0.0, model=model)
    with pytest.raises(ConfigError, match="--batch and --context"):
        bench_decode("tiny-dense", 0, 8, device="cpu", dtype="float32", model=model)
