import json

import pytest

from athanor.errors import ConfigError
from athanor.traffic.formats import athanor_log_record, detect_format
from athanor.traffic.parsers import TraceReader, read_columns

ROWS = {
    "mooncake": ['{"timestamp": 0, "input_length": 700, "output_length": 5, "hash_ids": [0, 1]}',
                 '{"timestamp": 1500, "input_length": 600, "output_length": 7, "hash_ids": [0, 2]}'],
    "azure": ["TIMESTAMP,ContextTokens,GeneratedTokens", "2023-11-16 18:17:03.9799600,4808,10",
              "2023-11-16 18:17:05.0000000,3180,8"],
    "burstgpt": ["Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type",
                 "5,ChatGPT,472,18,490,Conversation log", "7.5,GPT-4,1000,200,1200,API log"],
    "athanor": [json.dumps(athanor_log_record(100.0, 50, 9, [7], 0.1, 0.5)),
                json.dumps(athanor_log_record(101.0, 60, 3, None, None, None))],
    "openai": ['{"created": 10, "messages": [{"role": "user", "content": "hi"}], '
               '"usage": {"prompt_tokens": 12, "completion_tokens": 4}}',
               '{"created": 12, "messages": [{"role": "user", "content": "' + "x" * 40 + '"}], "max_tokens": 8}'],
}
SUFFIX = {"azure": ".csv", "burstgpt": ".csv"}


def write(tmp_path, fmt, lines):
    p = tmp_path / f"t{SUFFIX.get(fmt, '.jsonl')}"
    p.write_text("\n".join(lines) + "\n")
    return p


@pytest.mark.parametrize("fmt", sorted(ROWS))
def test_every_format_parses_and_is_detected(tmp_path, fmt):
    p = write(tmp_path, fmt, ROWS[fmt])
    assert detect_format(p) == fmt
    cols = read_columns(p)
    assert len(cols) == 2
    assert (cols.input_length > 0).all()
    assert cols.timestamp_s[1] > cols.timestamp_s[0]


def test_specific_values(tmp_path):
    c = read_columns(write(tmp_path, "mooncake", ROWS["mooncake"]))
    assert c.timestamp_s.tolist() == [0.0, 1.5] and c.hash_ids == [[0, 1], [0, 2]]
    c = read_columns(write(tmp_path, "azure", ROWS["azure"]))
    assert c.input_length.tolist() == [4808, 3180] and c.timestamp_s[1] - c.timestamp_s[0] == pytest.approx(1.02004)
    c = read_columns(write(tmp_path, "openai", ROWS["openai"]))
    assert c.input_length.tolist() == [12, 10] and c.output_length.tolist() == [4, 8]


BAD = {
    "mooncake": ('{"timestamp": 0, "input_length": -3, "output_length": 5}', "input_length"),
    "azure": ("2023-11-16 18:17:03.9,abc,10", "contexttokens"),
    "burstgpt": ("5,ChatGPT,472", "fields"),
    "athanor": ('{"timestamp": 1, "input_length": 5, "output_length": 2, "ttft_s": "x"', "JSON"),
    "openai": ('{"created": 1, "messages": "hello"}', "messages"),
}


@pytest.mark.parametrize("fmt", sorted(BAD))
def test_malformed_row_names_file_and_line(tmp_path, fmt):
    bad, word = BAD[fmt]
    lines = [*ROWS[fmt][:2], bad, ROWS[fmt][-1]]
    p = write(tmp_path, fmt, lines)
    with pytest.raises(ConfigError) as e:
        list(TraceReader(p, format=fmt))
    assert f"{p}:3:" in str(e.value) and word in str(e.value)
    reader = TraceReader(p, format=fmt, skip_bad=True)
    assert sum(len(c) for c in reader) == (2 if fmt in SUFFIX else 3) and reader.num_skipped == 1


def test_unknown_format_and_missing_file(tmp_path):
    p = tmp_path / "x.txt"
    p.write_text("hello world\n")
    with pytest.raises(ConfigError, match="--format"):
        TraceReader(p)
    with pytest.raises(ConfigError, match="no such trace file"):
        TraceReader(tmp_path / "nope.csv")
    with pytest.raises(ConfigError, match="unknown format"):
        TraceReader(p, format="parquet")


def test_chunks_bound_memory(tmp_path):
    lines = [ROWS["azure"][0]] + [f"2023-11-16 18:17:{i % 60:02d}.0,{i + 1},1" for i in range(1000)]
    chunks = list(TraceReader(write(tmp_path, "azure", lines), chunk_rows=128))
    assert max(len(c) for c in chunks) == 128 and sum(len(c) for c in chunks) == 1000
