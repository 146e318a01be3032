"""`athanor bench decode` on the CPU: a cell's timing and the windows after it, a grid in one record, and a step
that runs out of memory or fails recorded as such."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from athanor.bench.decode import candidate_source, decode_cell, out_of_memory_in_step, parse_candidates
from athanor.cli import main
from athanor.errors import ConfigError
from athanor.model.presets import get_preset
from athanor.model.random_init import random_model

PROVENANCE = ("date", "git_commit", "device", "device_name", "gpu", "python", "torch", "triton", "command")


def test_a_cell_times_the_captured_step_and_its_windows_after_it() -> None:
    model = random_model(get_preset("tiny-dense"), seed=1)
    record = decode_cell("tiny-dense", 2, 16, candidate="best", device="cpu", dtype="float32", iters=3,
                         min_time_s=0.0, model=model, windows=3)
    assert record["status"] == "ok" and record["ms_per_token"] > 0
    assert len(record["window_ms"]) == 3 and all(ms > 0 for ms in record["window_ms"])
    assert "window_ms" not in decode_cell("tiny-dense", 1, 8, device="cpu", dtype="float32", iters=2,
                                          min_time_s=0.0, model=model)
    with pytest.raises(ConfigError, match="--batch and --context"):
        decode_cell("tiny-dense", 0, 8, device="cpu", dtype="float32", model=model)


def test_the_grid_runs_every_cell_in_one_process_and_writes_one_record(tmp_path: Path,
                                                                       capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "decode.json"
    rc = main(["bench", "decode", "--model", "tiny-dense", "--device", "cpu", "--dtype", "float32", "--batch", "1,2",
               "--context", "8", "--candidate", "reference,best", "--iters", "2", "--json", str(out)])
    printed = capsys.readouterr().out.strip().splitlines()
    assert rc == 0 and len(printed) == 4 and printed[-1].endswith(f"-> {out}")
    record = json.loads(out.read_text())
    assert record["benchmark"] == "decode" and {"model", "dtype", "cells", *PROVENANCE} <= set(record)
    assert record["device"] == "cpu" and record["git_commit"] and record["torch"] and record["python"]
    cells = [(c["candidate"], c["compile"], c["batch"], c["context"], c["status"]) for c in record["cells"]]
    assert cells == [(cand, False, b, 8, "ok") for cand in ("reference", "best") for b in (1, 2)]


def test_candidates_name_their_compile_and_a_missing_file_before_anything_loads(tmp_path: Path) -> None:
    path = tmp_path / "mine.py"
    path.write_text("")
    assert parse_candidates(f"reference, best+compile,{path}") == [("reference", False), ("best", True),
                                                                     (str(path), False)]
    assert parse_candidates("reference,best", use_compile=True) == [("reference", True), ("best", True)]
    with pytest.raises(ConfigError, match="--candidate"):
        parse_candidates(" , ")


def test_bad_grid_flags_are_one_line_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for flags, said in ((["--batch", "1,x"], "--batch 1,x: give whole numbers"),
                        (["--candidate", str(tmp_path / "nope.py")], "no such file"),
                        (["--batch", "0"], "--batch and --context must be at least 1")):
        rc = main(["bench", "decode", "--model", "tiny-dense", "--device", "cpu", *flags])
        err = capsys.readouterr().err.strip().splitlines()
        assert rc == 2 and len(err) == 1 and said in err[0], err


@pytest.mark.parametrize("raised, status", [("torch.OutOfMemoryError('CUDA out of memory')", "does_not_fit"),
                                            ("ValueError('a bug')", "error"),
                                            ("NotImplementedError('no windows here')", "declined")])
def test_a_step_out_of_memory_beside_the_kv_cache_does_not_fit(tmp_path: Path, raised: str, status: str,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    # The 1B reference at batch 128, context 32k: its KV cache fits, its gather of each layer's cache does not.
    model = random_model(get_preset("tiny-dense"), seed=1)
    source, _ = candidate_source("reference", model.spec, False, "cpu")
    marker = "    def decode(self, batch: DecodeBatch) -> Tensor:\n"
    assert marker in source
    path = tmp_path / "candidate.py"
    path.write_text(source.replace(marker, marker + f"        raise {raised}\n"))
    record = decode_cell("tiny-dense", 2, 16, candidate=str(path), device="cpu", dtype="float32", iters=2,
                         min_time_s=0.0, model=model)
    assert record["status"] == status and "ms_per_token" not in record
    assert out_of_memory_in_step(record) == (status == "does_not_fit")
    # the command says so in one line ending with the exception, the traceback kept in its JSON
    out = tmp_path / "record.json"
    rc = main(["bench", "decode", "--model", "tiny-dense", "--batch", "2", "--context", "16", "--candidate", str(path),
               "--device", "cpu", "--dtype", "float32", "--iters", "2", "--json", str(out)])
    printed = capsys.readouterr().out.strip().splitlines()
    assert rc == 1 and len(printed) == 1 and f"{status}: " in printed[0] and str(out) in printed[0]
    said = {"does_not_fit": "CUDA out of memory", "error": "ValueError: a bug",
            "declined": "NotImplementedError: no windows here"}[status]
    assert said in printed[0]
    cell = json.loads(out.read_text())["cells"][0]
    assert "Traceback" in cell.get("error" if status == "error" else "traceback", "")
