import dataclasses

import numpy as np
import pytest

from athanor.cli import main
from athanor.traffic.chunk import RequestChunk
from athanor.traffic.drift import DriftMonitor, compare_profiles
from athanor.traffic.parsers import read_columns
from athanor.traffic.profile import profile_chunks

TRACE_FILES = ("mooncake_conversation.jsonl", "azure_llm_2023_code.csv", "azure_llm_2023_conv.csv")


def test_code_vs_conv_drifts(traces, capsys):
    rc = main(["traffic", "drift", str(traces / "azure_llm_2023_code.csv"), str(traces / "azure_llm_2023_conv.csv")])
    assert rc == 1
    assert "input_length" in capsys.readouterr().out


# A trace of each format (JSONL, CSV); the third trace: the slow tier's.
@pytest.mark.parametrize("name", [*TRACE_FILES[:2], pytest.param(TRACE_FILES[2], marks=pytest.mark.slow)])
def test_random_halves_not_flagged(traces, name):
    c = read_columns(traces / name)
    rng = np.random.default_rng(0)
    flagged = 0
    for _ in range(100):
        m = rng.random(len(c)) < 0.5
        a, b = (profile_chunks([RequestChunk(c.timestamp_s[k], c.input_length[k], c.output_length[k])], "half")
                for k in (m, ~m))
        flagged += compare_profiles(a, b).drifted
    assert flagged <= 5


def windows(c, shift_from=None, factor=1.3, share=0.2):
    n_in = c.input_length.astype(float).copy()
    if shift_from is not None:  # the next `share` of requests from the change point on
        end = shift_from + int(share * len(c))
        n_in[shift_from:end] *= factor
    w = ((c.timestamp_s - c.timestamp_s[0]) // 600).astype(int)
    return [profile_chunks([RequestChunk(c.timestamp_s[w == k], n_in[w == k].astype(np.int64),
                                         c.output_length[w == k])], f"w{k}") for k in range(w.max() + 1)], w


@pytest.mark.parametrize("name", TRACE_FILES)
def test_windows_warrant_at_most_one_recompile(traces, name):
    wins, _ = windows(read_columns(traces / name))
    monitor = DriftMonitor(reset_on_recompile=False)  # each window against the first
    for w in wins:
        monitor.observe(w)
    assert monitor.num_recompiles <= 1


@pytest.mark.parametrize("name", TRACE_FILES)
def test_planted_shift_flagged_within_two_windows(traces, name):
    c = read_columns(traces / name)
    start = int(0.45 * len(c))
    wins, w = windows(c, shift_from=start)
    first = int(w[start])
    assert any(compare_profiles(wins[0], wins[k]).drifted for k in (first, first + 1))
    assert any("input_length" in compare_profiles(wins[0], wins[k]).moved() for k in (first, first + 1))


def test_small_samples_not_judged():
    c = RequestChunk(np.arange(50.0), np.full(50, 10), np.full(50, 5))
    p = profile_chunks([c], "tiny")
    r = compare_profiles(p, dataclasses.replace(p, source="tiny2"))
    assert not r.drifted and "not judged" in r.note


@pytest.mark.parametrize("name", [*TRACE_FILES[:2], pytest.param(TRACE_FILES[2], marks=pytest.mark.slow)])
def test_shuffled_random_halves_of_a_file_do_not_drift(traces, name, tmp_path, capsys):
    """Rows out of time order (a log written as requests finish, a shuffled file) are read in arrival order: two
    random halves of one trace, each shuffled and written as a file, are the same traffic to `traffic drift`."""
    lines = [line + "\n" for line in (traces / name).read_text().splitlines()]
    header, rows = (lines[:1], lines[1:]) if name.endswith(".csv") else ([], lines)
    rng = np.random.default_rng(1)
    codes = []
    for split in range(20):
        pick = rng.random(len(rows)) < 0.5
        paths = []
        for side, keep in (("a", pick), ("b", ~pick)):
            half = [rows[i] for i in np.flatnonzero(keep)]
            rng.shuffle(half)
            path = tmp_path / f"{split}{side}{(traces / name).suffix}"
            path.write_text("".join(header + half))
            paths.append(str(path))
        codes.append(main(["traffic", "drift", *paths]))
    capsys.readouterr()
    assert codes == [0] * 20


def test_rows_out_of_order_are_read_in_arrival_order_with_their_blocks(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text("".join(f'{{"timestamp": {t}, "input_length": {n}, "output_length": 1, "hash_ids": {h}}}\n'
                            for t, n, h in ((30, 3, [3]), (10, 1, [1, 1]), (20, 2, []), (10, 4, [4]))))
    c = read_columns(path)
    assert c.timestamp_s.tolist() == [0.01, 0.01, 0.02, 0.03]  # Mooncake's milliseconds, in seconds
    assert c.input_length.tolist() == [1, 4, 2, 3]  # a stable sort: equal times keep their file order
    assert c.hash_ids == [[1, 1], [4], [], [3]]
