"""`athanor bench`: every benchmark is a sub-command, records carry their provenance, bad flags are one-line errors,
and `bench swap` runs end to end on a tiny preset. (The longer benchmarks run end to end in tests/slow/bench.)"""

from __future__ import annotations

import argparse
import importlib.util
import json
from pathlib import Path

import pytest

from athanor.bench.record import command_line, provenance, write_record, written
from athanor.cli import build_parser, main

PROVENANCE = ("date", "git_commit", "device", "device_name", "gpu", "python", "torch", "triton", "command")


def test_every_benchmark_is_a_sub_command_of_bench() -> None:
    bench = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)).choices["bench"]
    names = set(bench.get_default("bench_subparsers").choices)
    assert names == {"decode", "prefill", "collectives", "swap", "serve", "serve-stream", "serve-batching", "evaluate", "compile",
                     "reference", "tiers"}


def test_a_record_carries_its_provenance_and_is_written_only_when_asked(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    record = {"benchmark": "x", **provenance("cpu")}
    assert set(PROVENANCE) <= set(record) and record["device"] == "cpu" and record["torch"]
    assert write_record(record, "") is None and written(None) == ""
    out = write_record({**record, "dtype": object}, tmp_path / "deep" / "x.json")  # no JSON type: written as text
    assert out is not None and json.loads(out.read_text())["benchmark"] == "x" and written(out).endswith(str(out))
    monkeypatch.setattr("sys.argv", ["/venv/bin/athanor", "bench", "decode", "--model", "a b"])
    assert command_line() == "athanor bench decode --model 'a b'"


def test_bench_swap_runs_end_to_end_on_a_tiny_preset(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "swap.json"
    assert main(["bench", "swap", "--model", "tiny-dense", "--device", "cpu", "--swaps", "2", "--max-seqs", "2",
                 "--max-seq-len", "64", "--json", str(out)]) == 0
    printed = capsys.readouterr().out.strip().splitlines()
    assert len(printed) == 1 and "swap_s=" in printed[0] and printed[0].endswith(f"-> {out}")
    record = json.loads(out.read_text())
    assert record["benchmark"] == "swap" and set(PROVENANCE) <= set(record)
    assert len(record["swap_all_s"]) == 2 and record["respawn_verdict"] != "ok"
    assert record["experiment"]["max_abs_diff"] <= 1e-4


@pytest.mark.parametrize("argv, said", [
    (["evaluate", "--runs", "0"], "--runs must be at least 1"),
    (["swap", "--swaps", "0"], "--swaps must be at least 1"),
    (["compile", "--budget", "soon"], "--budget soon: use a positive duration"),
    (["tiers", "--resume"], "--resume and --report need --run-dir"),
    (["tiers", "--devices", "cpu,cpu"], "one lane per device"),
    (["tiers", "--replay", "no-such.json"], "--replay no-such.json: no such file"),
    (["serve-stream", "--max-tokens", "1"], "--max-tokens at least 2"),
    (["serve-batching", "--concurrency", "1"], "--concurrency must be at least 2"),
    (["reference", "--steps", "0"], "--steps, --prompt-len and --repeats must be at least 1"),
    (["prefill", "--tokens", "0"], "--tokens, --chunk and --repeats must be at least 1"),
])
def test_bad_flags_are_one_line_errors(argv: list[str], said: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", *argv, "--model", "tiny-dense"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and said in err[0], err


def test_the_reference_benchmark_names_the_extra_it_needs(monkeypatch: pytest.MonkeyPatch,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "transformers" else real(name, *a))
    assert main(["bench", "reference", "--model", "tiny-dense"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "pip install -e '.[test]'" in err[0]


def test_bench_prefill_times_a_chunked_prompt_on_a_tiny_preset(tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "prefill.json"
    assert main(["bench", "prefill", "--model", "tiny-dense", "--device", "cpu", "--tokens", "40,70", "--chunk",
                 "32", "--repeats", "1", "--candidate", "reference", "--json", str(out)]) == 0
    printed = capsys.readouterr().out.strip().splitlines()
    assert len(printed) == 2 and "prompt 70 (chunks of 32): TTFT" in printed[1]
    runs = json.loads(out.read_text())["cells"][0]["runs"]
    assert [r["tokens"] for r in runs] == [40, 70] and all(r["ttft_s"] > 0 and r["flops"] > 0 for r in runs)


def test_bench_serve_against_no_server_is_a_one_line_error(tmp_path: Path,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    trace = tmp_path / "trace.jsonl"
    trace.write_text('{"timestamp": 0, "input_length": 10, "output_length": 2, "hash_ids": [0]}\n')
    assert main(["bench", "serve", "--url", "http://127.0.0.1:9", "--trace", str(trace)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--url http://127.0.0.1:9: no server answers there" in err[0], err


def test_prompts_from_block_hashes_share_exactly_their_shared_blocks() -> None:
    from athanor.bench.serve import BLOCK_TOKENS, block_prompt

    pool = list(range(5000))
    a = block_prompt(pool, [0, 1, 2], 3 * BLOCK_TOKENS)
    b = block_prompt(pool, [0, 1, 7], 3 * BLOCK_TOKENS - 100)
    assert a[:2 * BLOCK_TOKENS] == b[:2 * BLOCK_TOKENS] and a[2 * BLOCK_TOKENS] != b[2 * BLOCK_TOKENS]
    assert len(b) == 3 * BLOCK_TOKENS - 100 and block_prompt(pool, [0, 1, 2], 3 * BLOCK_TOKENS) == a


def test_lru_simulation_counts_what_a_prefix_cache_of_that_size_still_computes() -> None:
    from athanor.bench.serve import BLOCK_TOKENS, lru_prefill_tokens

    b = BLOCK_TOKENS
    inputs = [3 * b, 3 * b + 5, 2 * b, 3 * b]
    hashes = [[1, 2, 3], [1, 2, 3, 4], [7, 8], [1, 2, 9]]
    # Room for everything: the second reuses three blocks, the fourth two.
    assert lru_prefill_tokens(inputs, hashes, 100 * b) == 3 * b + 5 + 2 * b + b
    # Room for three blocks: [7, 8] pushes out 1 and 2 (least recent), so the fourth computes all of its prompt.
    assert lru_prefill_tokens(inputs, hashes, 3 * b) == 3 * b + 5 + 2 * b + 3 * b
    # A whole prompt cached still computes its last token.
    assert lru_prefill_tokens([2 * b, 2 * b], [[1, 2], [1, 2]], 10 * b) == 2 * b + 1
