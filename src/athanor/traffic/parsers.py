"""Trace parsers: request logs in, columnar chunks of requests out (`TraceReader`).

Every format (`athanor.traffic.formats`) streams: a file is read in blocks of whole lines
(`BLOCK_BYTES`) and handed on in `RequestChunk`s of at most `chunk_rows` rows, so memory stays
bounded whatever the file's size. The format is detected from the first non-empty line or named
explicitly.

A malformed row stops the parse with ``file:line: what is wrong`` (a `ConfigError`); with
``skip_bad=True`` it is counted in `TraceReader.num_skipped` and skipped.

A block in the released Mooncake layout or a plain CSV goes through the vectorised parsers of
`fastparse.py`; any other block, and any block with a bad row, through the per-row parser of
`formats.py`, which is the reference the fast paths are tested against.
"""

from __future__ import annotations

import csv
import itertools
import json
import logging
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import BinaryIO

import numpy as np

from athanor.errors import ConfigError
from athanor.traffic.chunk import ColumnBuffer, RequestChunk
from athanor.traffic.fastparse import parse_csv, parse_mooncake
from athanor.traffic.formats import (
    FORMATS,
    IsoTime,
    athanor_row,
    count_field,
    describe_error,
    detect_format,
    mooncake_row,
    openai_row,
)

log = logging.getLogger(__name__)

BLOCK_BYTES = 4 << 20
SORT_ROWS = 4_000_000
"""Rows a trace reader sorts by arrival in memory (about 100 MB of columns); more stream in file order."""
"""Bytes of whole lines parsed at a time: bounds the parse's working memory."""


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
        """The requests in arrival order: a log written as requests finish (a server's under concurrency), or rows
        shuffled, would otherwise read as traffic other than what arrived. A stable sort, as equal timestamps are
        common (one second's resolution); in memory for the first `SORT_ROWS` rows, after which rows stream in file
        order (a file that big out of order is reported once)."""
        pieces = self._csv() if self.format in ("azure", "burstgpt") else self._jsonl()
        head: list[RequestChunk] = []
        num_head = 0
        for piece in pieces:
            if len(piece):
                head.append(piece)
                num_head += len(piece)
            if num_head >= SORT_ROWS:
                break
        if not head:
            return
        first = RequestChunk.concat(head)
        if bool(np.any(np.diff(first.timestamp_s) < 0)):
            first = first.take(np.argsort(first.timestamp_s, kind="stable"))
            log.info("%s: rows not in arrival order: read sorted by arrival", self.path)
        yield from self._in_chunks(itertools.chain([first], pieces))

    def _in_chunks(self, pieces: Iterator[RequestChunk]) -> Iterator[RequestChunk]:
        pending: list[RequestChunk] = []
        num_pending = 0
        last_t, warned = float("-inf"), False
        for piece in pieces:
            if not len(piece):
                continue
            t = piece.timestamp_s
            if not warned and (float(t[0]) < last_t or bool(np.any(np.diff(t) < 0))):
                log.warning("%s: rows out of time order past its first %d: they are read in file order (sort the "
                            "file by arrival time)", self.path, SORT_ROWS)
                warned = True
            last_t = max(last_t, float(t.max()))
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
        row_fn = {"mooncake": mooncake_row, "athanor": athanor_row, "openai": openai_row}[self.format]
        with open(self.path, "rb") as f:
            for first_line, block in self._blocks(f, 1):
                fast = parse_mooncake(block) if self.format == "mooncake" else None
                if fast is not None:
                    yield RequestChunk(*fast)
                    continue
                cols = ColumnBuffer(with_hashes=self.format in ("mooncake", "athanor"),
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
                        self._bad(lineno, describe_error(e))
                yield cols.flush()

    # -- CSV ------------------------------------------------------------------------------
    def _csv(self) -> Iterator[RequestChunk]:
        with open(self.path, "rb") as f:
            header = [h.strip().lower() for h in f.readline().decode("utf-8", errors="replace").split(",")]
            if self.format == "azure":
                names = ("timestamp", "contexttokens", "generatedtokens")
                parse_time: Callable[[str], float] = IsoTime()
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
                cols = ColumnBuffer(with_hashes=False, with_latency=False)
                text = block.decode("utf-8", errors="replace").split("\n")[:-1]
                for lineno, row in enumerate(csv.reader(text), first_line):
                    if not row:
                        continue
                    if len(row) != width:
                        self._bad(lineno, f"{len(row)} fields, the header has {width}")
                        continue
                    try:
                        t = parse_time(row[i_t])
                        n_in, n_out = count_field(row[i_in], names[1]), count_field(row[i_out], names[2])
                    except ValueError as e:
                        self._bad(lineno, describe_error(e))
                        continue
                    cols.add(t, n_in, n_out, None, None, None)
                yield cols.flush()


def read_columns(path: str | Path, format: str | None = None, skip_bad: bool = False) -> RequestChunk:
    """A whole (small) trace as one `RequestChunk`: for tests and replay, not for huge files."""
    reader = TraceReader(path, format, skip_bad)
    chunks = list(reader)
    if not chunks:
        raise ConfigError(f"{reader.path}: no requests in the file")
    return RequestChunk.concat(chunks)
