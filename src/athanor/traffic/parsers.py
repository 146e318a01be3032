"""Trace parsers: request logs in, columnar chunks of requests out.

Every format streams: a file is read line by line and handed on in `RequestChunk`s of at
most `chunk_rows` rows (numpy columns), so memory stays bounded whatever the file's size.
The format is detected from the first non-empty line or named explicitly:

- ``mooncake``: JSONL ``{"timestamp": ms, "input_length", "output_length", "hash_ids": [...]}``
  (Mooncake FAST'25 trace release; ``hash_ids`` name 512-token prefix blocks).
- ``azure``: CSV ``TIMESTAMP,ContextTokens,GeneratedTokens`` (Azure LLM inference traces 2023/2024).
- ``burstgpt``: CSV ``Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type``.
- ``athanor``: the JSONL request log athanor's server writes, one `athanor_log_record` per line.
- ``openai``: JSONL of OpenAI-style requests (``messages``; lengths from ``usage`` when present).

A malformed row stops the parse with ``file:line: what is wrong`` (a `ConfigError`); with
``skip_bad=True`` it is counted in `TraceReader.num_skipped` and skipped.

The file is read in blocks of whole lines (`BLOCK_BYTES`). A block in the released Mooncake
layout or a plain CSV goes through the vectorised parsers of `fastparse.py` (a million rows in
seconds); any other block, and any block with a bad row, through the per-row parser here, which
is the reference the fast paths are tested against. Block hashes travel as one flat array plus
offsets (`RequestChunk.block_hashes`, `block_offsets`), not as Python lists.
"""

from __future__ import annotations

import csv
import datetime as dt
import itertools
import json
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from athanor.errors import ConfigError
from athanor.traffic.fastparse import parse_csv, parse_mooncake

log = logging.getLogger(__name__)

FORMATS = ("mooncake", "azure", "burstgpt", "athanor", "openai")
MOONCAKE_BLOCK_TOKENS = 512
"""Tokens per `hash_ids` block in the Mooncake trace (its README)."""
BLOCK_BYTES = 4 << 20
"""Bytes of whole lines parsed at a time: bounds the parse's working memory."""
CHARS_PER_TOKEN = 4.0
"""OpenAI's rule of thumb for English text, used only when an OpenAI-style log has no `usage`."""


@dataclass(frozen=True)
class RequestChunk:
    """Up to `chunk_rows` consecutive requests of one trace, as columns (CPU numpy)."""

    timestamp_s: np.ndarray  # [N] float64, seconds (absolute or relative to the trace start)
    input_length: np.ndarray  # [N] int64 prompt tokens
    output_length: np.ndarray  # [N] int64 generated tokens
    block_hashes: np.ndarray | None = None
    """[B] int64: every request's prefix block hashes, concatenated (None when the format has none)."""
    block_offsets: np.ndarray | None = None
    """[N+1] int64: request i's blocks are block_hashes[block_offsets[i]:block_offsets[i+1]]."""
    ttft_s: np.ndarray | None = None  # [N] float64, NaN where unknown
    latency_s: np.ndarray | None = None  # [N] float64, NaN where unknown

    def __len__(self) -> int:
        return len(self.input_length)

    @property
    def hash_ids(self) -> list[list[int]] | None:
        """Prefix block hashes per request, as lists (for small chunks: replay, tests)."""
        if self.block_hashes is None or self.block_offsets is None:
            return None
        flat, off = self.block_hashes.tolist(), self.block_offsets.tolist()
        return [flat[a:b] for a, b in itertools.pairwise(off)]

    def rows(self, start: int, stop: int) -> RequestChunk:
        """Requests start..stop-1."""
        hashes = offsets = None
        if self.block_hashes is not None and self.block_offsets is not None:
            a, b = int(self.block_offsets[start]), int(self.block_offsets[stop])
            hashes, offsets = self.block_hashes[a:b], self.block_offsets[start:stop + 1] - a
        return RequestChunk(
            self.timestamp_s[start:stop], self.input_length[start:stop], self.output_length[start:stop], hashes,
            offsets, None if self.ttft_s is None else self.ttft_s[start:stop],
            None if self.latency_s is None else self.latency_s[start:stop],
        )

    @staticmethod
    def concat(chunks: list[RequestChunk]) -> RequestChunk:
        def cat(xs: list[np.ndarray | None]) -> np.ndarray | None:
            arrays = [x for x in xs if x is not None]
            return np.concatenate(arrays) if len(arrays) == len(xs) else None

        hashes: np.ndarray | None = None
        offsets: np.ndarray | None = None
        pairs = [(c.block_hashes, c.block_offsets) for c in chunks]
        if all(h is not None and o is not None for h, o in pairs):
            hashes = np.concatenate([h for h, _ in pairs if h is not None])
            parts, base = [np.zeros(1, dtype=np.int64)], 0
            for h, o in pairs:
                assert h is not None and o is not None
                parts.append(o[1:] + base)
                base += len(h)
            offsets = np.concatenate(parts)
        return RequestChunk(
            np.concatenate([c.timestamp_s for c in chunks]), np.concatenate([c.input_length for c in chunks]),
            np.concatenate([c.output_length for c in chunks]), hashes, offsets,
            cat([c.ttft_s for c in chunks]), cat([c.latency_s for c in chunks]),
        )


def hash_csr(hash_ids: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
    """(block_hashes, block_offsets) of per-request lists of block hashes."""
    offsets = np.zeros(len(hash_ids) + 1, dtype=np.int64)
    np.cumsum([len(h) for h in hash_ids], out=offsets[1:])
    flat = np.fromiter((x for h in hash_ids for x in h), dtype=np.int64, count=int(offsets[-1]))
    return flat, offsets


def athanor_log_record(
    timestamp_s: float,
    input_length: int,
    output_length: int,
    hash_ids: list[int] | None = None,
    ttft_s: float | None = None,
    latency_s: float | None = None,
) -> dict[str, Any]:
    """One line of athanor's request log (what `serve` writes and the `athanor` format reads)."""
    rec: dict[str, Any] = {"timestamp": timestamp_s, "input_length": input_length, "output_length": output_length}
    if hash_ids is not None:
        rec["hash_ids"] = hash_ids
    rec["ttft_s"] = ttft_s
    rec["latency_s"] = latency_s
    return rec


def detect_format(path: Path) -> str:
    """The format of `path`, judged from its first non-empty line."""
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            if line.strip():
                return _detect_line(path, line)
    raise ConfigError(f"{path}: the file is empty: give a request log or trace")


def _detect_line(path: Path, line: str) -> str:
    s = line.strip()
    if s.startswith("{"):
        try:
            rec = json.loads(s)
        except json.JSONDecodeError:
            raise ConfigError(f"{path}:1: the first line is not valid JSON: name the format with --format") from None
        if "messages" in rec:
            return "openai"
        if "ttft_s" in rec or "latency_s" in rec:
            return "athanor"
        if "input_length" in rec and "output_length" in rec:
            return "mooncake"
    else:
        header = [h.strip().lower() for h in s.split(",")]
        if header[:3] == ["timestamp", "contexttokens", "generatedtokens"]:
            return "azure"
        if "request tokens" in header and "response tokens" in header:
            return "burstgpt"
    raise ConfigError(f"{path}:1: unknown trace format: name it with --format ({', '.join(FORMATS)})")


class TraceReader:
    """Iterate a trace file as `RequestChunk`s; counts the rows skipped with `skip_bad`."""

    def __init__(self, path: str | Path, format: str | None = None, skip_bad: bool = False,
                 chunk_rows: int = 65536) -> None:
        self.path = Path(path)
        if not self.path.is_file():
            raise ConfigError(f"{self.path}: no such trace file: give a path to a request log")
        if format is not None and format not in FORMATS:
            raise ConfigError(f"--format {format!r}: unknown format: use one of {', '.join(FORMATS)}")
        self.format = format or detect_format(self.path)
        self.skip_bad = skip_bad
        self.chunk_rows = chunk_rows
        self.num_skipped = 0
        self.num_rows = 0

    def __iter__(self) -> Iterator[RequestChunk]:
        pending: list[RequestChunk] = []
        num_pending = 0
        pieces = self._csv() if self.format in ("azure", "burstgpt") else self._jsonl()
        for piece in pieces:
            if not len(piece):
                continue
            pending.append(piece)
            num_pending += len(piece)
            if num_pending >= self.chunk_rows:
                whole = RequestChunk.concat(pending)
                cut = num_pending - num_pending % self.chunk_rows
                for a in range(0, cut, self.chunk_rows):
                    self.num_rows += self.chunk_rows
                    yield whole.rows(a, a + self.chunk_rows)
                pending = [whole.rows(cut, num_pending)] if cut < num_pending else []
                num_pending -= cut
        if num_pending:
            self.num_rows += num_pending
            yield RequestChunk.concat(pending)

    # -- errors -------------------------------------------------------------------------
    def _bad(self, lineno: int, what: str) -> None:
        if not self.skip_bad:
            raise ConfigError(f"{self.path}:{lineno}: {what} (pass --skip-bad to skip such rows)")
        self.num_skipped += 1
        if self.num_skipped <= 3:
            log.warning("%s:%d: skipped: %s", self.path, lineno, what)

    def _blocks(self, f: BinaryIO, lineno: int) -> Iterator[tuple[int, bytes]]:
        """(number of its first line, block) for blocks of about BLOCK_BYTES of whole lines."""
        rest = b""
        while True:
            data = f.read(BLOCK_BYTES)
            if not data:
                if rest:
                    yield lineno, rest + b"\n"
                return
            data = rest + data
            cut = data.rfind(b"\n") + 1
            block, rest = data[:cut], data[cut:]
            if block:
                yield lineno, block
                lineno += block.count(b"\n")

    # -- JSONL ----------------------------------------------------------------------------
    def _jsonl(self) -> Iterator[RequestChunk]:
        row_fn = {"mooncake": _mooncake_row, "athanor": _athanor_row, "openai": _openai_row}[self.format]
        with open(self.path, "rb") as f:
            for first_line, block in self._blocks(f, 1):
                fast = parse_mooncake(block) if self.format == "mooncake" else None
                if fast is not None:
                    yield RequestChunk(*fast)
                    continue
                cols = _Columns(with_hashes=self.format in ("mooncake", "athanor"),
                                with_latency=self.format == "athanor")
                for lineno, line in enumerate(block.decode("utf-8", errors="replace").split("\n")[:-1], first_line):
                    if not line.strip():
                        continue
                    try:
                        rec = json.loads(line)
                    except json.JSONDecodeError as e:
                        self._bad(lineno, f"not valid JSON ({e.msg} at column {e.colno})")
                        continue
                    try:
                        cols.add(*row_fn(rec))
                    except (KeyError, TypeError, ValueError, AttributeError) as e:
                        self._bad(lineno, _what(e))
                yield cols.flush()

    # -- CSV ------------------------------------------------------------------------------
    def _csv(self) -> Iterator[RequestChunk]:
        with open(self.path, "rb") as f:
            header = [h.strip().lower() for h in f.readline().decode("utf-8", errors="replace").split(",")]
            if self.format == "azure":
                names = ("timestamp", "contexttokens", "generatedtokens")
                parse_time: Callable[[str], float] = _IsoTime()
            else:
                names = ("timestamp", "request tokens", "response tokens")
                parse_time = float
            try:
                i_t, i_in, i_out = (header.index(n) for n in names)
            except ValueError:
                raise ConfigError(f"{self.path}:1: header {header} lacks one of {list(names)}: "
                                  f"is this really a {self.format} trace? name the format with --format") from None
            width = len(header)
            for first_line, block in self._blocks(f, 2):
                fast = parse_csv(block, width, (i_t, i_in, i_out), iso_time=self.format == "azure")
                if fast is not None:
                    yield RequestChunk(*fast)
                    continue
                cols = _Columns(with_hashes=False, with_latency=False)
                text = block.decode("utf-8", errors="replace").split("\n")[:-1]
                for lineno, row in enumerate(csv.reader(text), first_line):
                    if not row:
                        continue
                    if len(row) != width:
                        self._bad(lineno, f"{len(row)} fields, the header has {width}")
                        continue
                    try:
                        t = parse_time(row[i_t])
                        n_in, n_out = _count(row[i_in], names[1]), _count(row[i_out], names[2])
                    except ValueError as e:
                        self._bad(lineno, _what(e))
                        continue
                    cols.add(t, n_in, n_out, None, None, None)
                yield cols.flush()


def _what(e: Exception) -> str:
    if isinstance(e, KeyError):
        return f"missing field {e.args[0]!r}"
    return str(e)


def _count(value: Any, field: str) -> int:
    """A token count: a non-negative integer (JSON int or CSV text)."""
    if isinstance(value, bool) or not isinstance(value, (int, str, float)):
        raise ValueError(f"field {field!r} is {value!r}, expected a token count")
    try:
        n = int(value)
    except ValueError:
        raise ValueError(f"field {field!r} is {value!r}, expected a token count") from None
    if n < 0 or (isinstance(value, float) and value != n):
        raise ValueError(f"field {field!r} is {value!r}, expected a non-negative integer")
    return n


def _number(value: Any, field: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"field {field!r} is {value!r}, expected a number")
    return float(value)


def _opt_number(value: Any, field: str) -> float:
    return float("nan") if value is None else _number(value, field)


Row = tuple[float, int, int, "list[int] | None", "float | None", "float | None"]


def _mooncake_row(rec: dict[str, Any]) -> Row:
    hashes = rec.get("hash_ids", [])
    if not isinstance(hashes, list):
        raise ValueError(f"field 'hash_ids' is {hashes!r}, expected a list of block ids")
    return (_number(rec["timestamp"], "timestamp") / 1000.0, _count(rec["input_length"], "input_length"),
            _count(rec["output_length"], "output_length"), hashes, None, None)


def _athanor_row(rec: dict[str, Any]) -> Row:
    hashes = rec.get("hash_ids") or []
    if not isinstance(hashes, list):
        raise ValueError(f"field 'hash_ids' is {hashes!r}, expected a list of block hashes")
    return (_number(rec["timestamp"], "timestamp"), _count(rec["input_length"], "input_length"),
            _count(rec["output_length"], "output_length"), hashes,
            _opt_number(rec.get("ttft_s"), "ttft_s"), _opt_number(rec.get("latency_s"), "latency_s"))


def _openai_row(rec: dict[str, Any]) -> Row:
    messages = rec["messages"]
    if not isinstance(messages, list):
        raise ValueError(f"field 'messages' is {type(messages).__name__}, expected a list")
    t = rec.get("timestamp", rec.get("created", 0.0))
    usage = rec.get("usage") or {}
    if "prompt_tokens" in usage:
        n_in = _count(usage["prompt_tokens"], "usage.prompt_tokens")
    else:  # no tokenizer here: estimate from characters, as OpenAI's guidance does
        chars = sum(len(str(m.get("content", ""))) for m in messages if isinstance(m, dict))
        n_in = max(1, round(chars / CHARS_PER_TOKEN))
    if "completion_tokens" in usage:
        n_out = _count(usage["completion_tokens"], "usage.completion_tokens")
    else:
        n_out = _count(rec.get("max_tokens", rec.get("max_completion_tokens", 0)), "max_tokens")
    return (_number(t, "timestamp"), n_in, n_out, None, None, None)


class _IsoTime:
    """Parses `2023-11-16 18:17:03.9799600` fast: the date part rarely changes, so cache it."""

    def __init__(self) -> None:
        self._date = ""
        self._epoch = 0.0

    def __call__(self, s: str) -> float:
        s = s.strip()
        if len(s) < 19 or s[10] not in " T" or s[13] != ":" or s[16] != ":":
            raise ValueError(f"timestamp {s!r} is not 'YYYY-MM-DD HH:MM:SS[.fraction]'")
        date = s[:10]
        if date != self._date:
            try:
                d = dt.datetime.strptime(date, "%Y-%m-%d").replace(tzinfo=dt.timezone.utc)
            except ValueError:
                raise ValueError(f"timestamp {s!r} has no valid date") from None
            self._date, self._epoch = date, d.timestamp()
        try:
            return self._epoch + int(s[11:13]) * 3600 + int(s[14:16]) * 60 + float(s[17:])
        except ValueError:
            raise ValueError(f"timestamp {s!r} has no valid time of day") from None


class _Columns:
    """Row buffer that turns into a `RequestChunk`."""

    def __init__(self, with_hashes: bool, with_latency: bool) -> None:
        self.with_hashes, self.with_latency = with_hashes, with_latency
        self._reset()

    def _reset(self) -> None:
        self.t: list[float] = []
        self.n_in: list[int] = []
        self.n_out: list[int] = []
        self.hashes: list[list[int]] = []
        self.ttft: list[float] = []
        self.lat: list[float] = []

    def __len__(self) -> int:
        return len(self.t)

    def add(self, t: float, n_in: int, n_out: int, hashes: list[int] | None,
            ttft: float | None, lat: float | None) -> None:
        self.t.append(t)
        self.n_in.append(n_in)
        self.n_out.append(n_out)
        if self.with_hashes:
            self.hashes.append(hashes or [])
        if self.with_latency:
            self.ttft.append(float("nan") if ttft is None else ttft)
            self.lat.append(float("nan") if lat is None else lat)

    def flush(self) -> RequestChunk:
        hashes, offsets = hash_csr(self.hashes) if self.with_hashes else (None, None)
        chunk = RequestChunk(
            np.asarray(self.t, dtype=np.float64), np.asarray(self.n_in, dtype=np.int64),
            np.asarray(self.n_out, dtype=np.int64), hashes, offsets,
            np.asarray(self.ttft, dtype=np.float64) if self.with_latency else None,
            np.asarray(self.lat, dtype=np.float64) if self.with_latency else None,
        )
        self._reset()
        return chunk


def read_columns(path: str | Path, format: str | None = None, skip_bad: bool = False) -> RequestChunk:
    """A whole (small) trace as one `RequestChunk`: for tests and replay, not for huge files."""
    reader = TraceReader(path, format, skip_bad)
    chunks = list(reader)
    if not chunks:
        raise ConfigError(f"{reader.path}: no requests in the file")
    return RequestChunk.concat(chunks)


__all__ = ["FORMATS", "RequestChunk", "TraceReader", "athanor_log_record", "detect_format", "hash_csr", "read_columns"]
