"""Every fast path against its plain reference on the same inputs (STYLE.md)."""

import itertools

import numpy as np
import pytest

from athanor.traffic import parsers, sketch
from athanor.traffic.fastparse import parse_csv, parse_mooncake
from athanor.traffic.parsers import TraceReader, read_columns
from athanor.traffic.sketch import PrefixLRU, ReferencePrefixLRU


def reference_columns(path, monkeypatch, fmt=None):
    with monkeypatch.context() as m:  # the row parser alone
        m.setattr(parsers, "parse_mooncake", lambda block: None)
        m.setattr(parsers, "parse_csv", lambda *a, **k: None)
        return read_columns(path, fmt)


def assert_same(a, b):
    np.testing.assert_allclose(a.timestamp_s, b.timestamp_s, rtol=0, atol=1e-6)
    assert np.array_equal(a.input_length, b.input_length) and np.array_equal(a.output_length, b.output_length)
    assert (a.block_hashes is None) == (b.block_hashes is None)
    if a.block_hashes is not None:
        assert np.array_equal(a.block_hashes, b.block_hashes) and np.array_equal(a.block_offsets, b.block_offsets)


@pytest.mark.parametrize("name", ["mooncake_conversation.jsonl", "azure_llm_2023_code.csv", "azure_llm_2023_conv.csv"])
def test_fast_parsers_match_row_parser_on_shared_traces(traces, monkeypatch, name):
    block = (traces / name).read_bytes()
    if name.endswith(".jsonl"):
        assert parse_mooncake(block) is not None  # the released layout takes the fast path
    else:
        body = block.split(b"\n", 1)[1].rstrip(b"\r\n") + b"\n"
        assert parse_csv(body, 3, (0, 1, 2), iso_time=True) is not None
    assert_same(read_columns(traces / name), reference_columns(traces / name, monkeypatch))


GOOD = '{"timestamp": %s, "input_length": %s, "output_length": %s, "hash_ids": [%s]}'
FALLBACK = [  # valid JSON the fast path leaves to the row parser, and malformed rows it must not accept
    '{"input_length": 5, "timestamp": 1, "output_length": 2, "hash_ids": [1]}',
    '{"timestamp": 1.5, "input_length": 5, "output_length": 2, "hash_ids": [1]}',
    '{"timestamp":1,"input_length":5,"output_length":2,"hash_ids":[1]}',
    '{"timestamp": 1, "input_length": 5, "output_length": 2}',
    '{"timestamp": 1, "input_length": 05, "output_length": 2, "hash_ids": [1]}',
    '{"timestamp": 1, "input_length": , "output_length": 2, "hash_ids": [1]}',
    '{"timestamp": 1, "input_length": 5, "output_length": 2, "hash_ids": [1, , 2]}',
    '{"timestamp": 1, "input_length": 5 6, "output_length": 2, "hash_ids": [1]}',
    '{"timestamp": 1, "input_length": 5, "output_length": 2, "hash_ids": [1 2]}',
    '{"times1tamp": 1, "input_length": 5, "output_length": 2, "hash_ids": [1]}',
    '{"timestamp": 1, "input_length": -5, "output_length": 2, "hash_ids": [1]}',
    '{"timestamp": 1, "input_length": 5, "output_length": 2, "hash_ids": [12345678901234567]}',
    '',
]


@pytest.mark.parametrize("odd", FALLBACK)
def test_mooncake_fast_path_falls_back_on_anything_else(tmp_path, monkeypatch, odd):
    rng = np.random.default_rng(len(odd))
    rows = [GOOD % (rng.integers(0, 10**13), rng.integers(0, 10**6), rng.integers(0, 5000),
                    ", ".join(str(x) for x in rng.integers(0, 10**16, rng.integers(0, 40)))) for _ in range(50)]
    assert parse_mooncake(("\n".join(rows) + "\n").encode()) is not None
    rows.insert(25, odd)
    block = ("\n".join(rows) + "\n").encode()
    assert parse_mooncake(block) is None
    p = tmp_path / "t.jsonl"
    p.write_bytes(block)
    try:
        ref = reference_columns(p, monkeypatch, "mooncake")
    except Exception as e:  # a malformed row: the reader must say the same
        with pytest.raises(type(e), match=":26:"):
            read_columns(p, "mooncake")
    else:
        assert_same(read_columns(p, "mooncake"), ref)


def test_csv_fast_paths_match_row_parser(tmp_path, monkeypatch):
    rng = np.random.default_rng(0)
    lines = ["Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type"]
    lines += [f"{t:.3f},GPT-4,{a},{b},{a + b},Conversation log" for t, a, b in
              zip(np.cumsum(rng.exponential(1, 3000)), rng.integers(0, 9000, 3000), rng.integers(0, 900, 3000),
                  strict=True)]
    p = tmp_path / "b.csv"
    p.write_text("\n".join(lines) + "\n")
    assert_same(read_columns(p), reference_columns(p, monkeypatch))
    body = ("\n".join(lines[1:]) + "\n").encode()
    assert parse_csv(body, 6, (0, 2, 3), iso_time=False) is not None
    for bad in (b'1,"GPT-4, x",1,2,3,API log\n', b"1,GPT-4,1,2\n", b"1,GPT-4,-1,2,3,API log\n", b"1,GPT,x,2,3,a\n"):
        assert parse_csv(body + bad, 6, (0, 2, 3), iso_time=False) is None


def test_chunks_split_exactly_with_hashes(traces):
    whole = read_columns(traces / "mooncake_conversation.jsonl")
    chunks = list(TraceReader(traces / "mooncake_conversation.jsonl", chunk_rows=1000))
    assert [len(c) for c in chunks[:-1]] == [1000] * (len(chunks) - 1)
    assert_same(parsers.RequestChunk.concat(chunks), whole)
    assert chunks[3].hash_ids == whole.hash_ids[3000:4000]


def share(blocks, n_in, block_tokens=512):
    return float(np.minimum(blocks * block_tokens, n_in).sum() / n_in.sum())


@pytest.mark.parametrize("capacity", [256, 4096, 16384, 65536])
def test_prefix_lru_matches_reference_on_mooncake(traces, capacity):
    c = read_columns(traces / "mooncake_conversation.jsonl")
    ref = ReferencePrefixLRU(capacity)
    want = np.array([ref.lookup_insert(h) for h in c.hash_ids])
    got = PrefixLRU(capacity).lookup_insert_many(c.block_hashes, c.block_offsets)
    assert abs(share(got, c.input_length) - share(want, c.input_length)) < 0.005


def test_prefix_lru_matches_reference_under_heavy_reuse(monkeypatch):
    """Skewed reuse at every distance, so the blockwise count of undecided accesses runs."""
    rng = np.random.default_rng(1)
    calls = []
    real = sketch._later_count
    monkeypatch.setattr(sketch, "_later_count", lambda *a: calls.append(1) or real(*a))
    lens = rng.integers(0, 12, 4000)
    flat = (rng.zipf(1.3, int(lens.sum())) % 3000).astype(np.int64)
    offsets = np.concatenate([[0], np.cumsum(lens)])
    for capacity in (64, 500, 1500):
        ref = ReferencePrefixLRU(capacity)
        want = np.array([ref.lookup_insert(flat[a:b].tolist()) for a, b in itertools.pairwise(offsets)])
        lru = PrefixLRU(capacity)
        got = np.concatenate([lru.lookup_insert_many(flat[offsets[a]:offsets[b]], offsets[a:b + 1] - offsets[a])
                              for a, b in ((0, 1500), (1500, 4000))])  # two chunks: state carries over
        assert abs(got.sum() - want.sum()) <= 0.005 * want.sum()
    assert calls
