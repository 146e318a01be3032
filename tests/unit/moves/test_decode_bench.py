"""`athanor bench decode` on the CPU: a record with its timing, and the windows after it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from athanor.cli import main
from athanor.errors import ConfigError
from athanor.model.presets import get_preset
from athanor.model.random_init import random_model
from athanor.moves.decode_bench import bench_decode, candidate_source, out_of_memory_in_step


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


@pytest.mark.parametrize("raised, status", [("torch.OutOfMemoryError('CUDA out of memory')", "does_not_fit"),
                                            ("ValueError('a bug')", "error")])
def test_a_step_out_of_memory_beside_the_kv_cache_does_not_fit(tmp_path: Path, raised: str, status: str,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    # The 1B reference at batch 128, context 32k: its KV cache fits, its gather of each layer's cache does not.
    model = random_model(get_preset("tiny-dense"), seed=1)
    source, _ = candidate_source("reference", model.spec, False, "cpu")
    marker = "    def decode(self, batch: DecodeBatch) -> Tensor:\n"
    assert marker in source
    path = tmp_path / "candidate.py"
    path.write_text(source.replace(marker, marker + f"        raise {raised}\n"))
    record = bench_decode("tiny-dense", 2, 16, candidate=str(path), device="cpu", dtype="float32", iters=2,
                          min_time_s=0.0, model=model)
    assert record["status"] == status and "ms_per_token" not in record
    assert out_of_memory_in_step(record) == (status == "does_not_fit")
    # the command says so in one line ending with the exception, the traceback kept in its JSON
    out = tmp_path / "record.json"
    rc = main(["bench", "decode", "--model", "tiny-dense", "--batch", "2", "--context", "16", "--candidate", str(path),
               "--device", "cpu", "--dtype", "float32", "--iters", "2", "--json", str(out)])
    printed = capsys.readouterr().out.strip().splitlines()
    assert rc == 1 and len(printed) == 1 and f"{status}: " in printed[0] and str(out) in printed[0]
    assert ("CUDA out of memory" if status == "does_not_fit" else "ValueError: a bug") in printed[0]
    assert "Traceback" in json.loads(out.read_text()).get("traceback" if status == "does_not_fit" else "error", "")
