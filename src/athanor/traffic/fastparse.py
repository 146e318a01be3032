"""Vectorised parsers for the common trace layouts; `parsers.TraceReader` falls back to the
per-row reference parser (`formats`) for any block of lines they do not accept.

Each function takes a block of complete lines (bytes ending in a newline) and returns numpy
columns, or None when a line is outside the strict form it handles (another key, a float or
negative number, a quoted CSV field, a blank line, a malformed row): the row parser then reads
the block and reports `file:line` errors as usual. Equal results on accepted input are tested
against the row parser (tests/unit/traffic/test_parsers.py).
"""

from __future__ import annotations

import numpy as np

_HEAD = b'{"timestamp": , "input_length": , "output_length": , "hash_ids": ['
"""A Mooncake line with its digits removed starts so (Python's `json.dumps` spacing, as released)."""
_HEAD_BYTES = np.frombuffer(_HEAD, dtype=np.uint8)
_ALLOWED = bytes(sorted(set(_HEAD + b"0123456789]}\n")))
_DIGITS = b"0123456789"


def parse_mooncake(block: bytes) -> tuple[np.ndarray, ...] | None:
    """Mooncake lines `{"timestamp": ms, "input_length": n, "output_length": n, "hash_ids": [h, ...]}`
    in that order and spacing, non-negative integers -> (timestamp_s, input, output, hashes, offsets).

    Checks: only the bytes of that layout; each line's skeleton (the line less its digits) is the
    head, then `, ` once per further hash, then `]}`; every digit run sits in a value slot (after
    a space or `[`, before `,` or `]`, no leading zero, at most 16 digits) and each line holds
    exactly 3 + its number of hashes runs, so no slot is empty or holds two numbers.
    """
    n = block.count(b"\n")
    if n == 0 or block.translate(None, _ALLOWED):
        return None
    skel_bytes = block.translate(None, _DIGITS)
    skel = np.frombuffer(skel_bytes, dtype=np.uint8)
    ends = np.flatnonzero(skel == 10)  # [n] newline of each line, in the skeleton
    starts = np.concatenate([[0], ends[:-1] + 1])
    head = len(_HEAD)
    middle = ends - 2 - (starts + head)  # length of the ", , ," part between the head and "]}"
    if (middle < 0).any() or (middle % 2).any():
        return None
    if not (np.array_equal(skel[starts[:, None] + np.arange(head)], np.broadcast_to(_HEAD_BYTES, (n, head)))
            and (skel[ends - 2] == 93).all() and (skel[ends - 1] == 125).all()):
        return None
    middles = int(middle.sum()) // 2
    if skel_bytes.count(b", ") != 3 * n + middles:  # each middle is exactly (", ")*: nothing else in it
        return None
    buf = np.frombuffer(block, dtype=np.uint8)
    is_digit = (buf - 48) < 10  # the block ends in a newline, so a run never touches its end
    if is_digit[0]:
        return None
    edges = np.flatnonzero(is_digit[1:] != is_digit[:-1]) + 1
    run_start, run_end = edges[0::2], edges[1::2]
    lens = run_end - run_start
    before, after = buf[run_start - 1], buf[run_end]
    if (lens.max(initial=1) > 16 or ((buf[run_start] == 48) & (lens > 1)).any()
            or not ((before == 32) | (before == 91)).all() or not ((after == 44) | (after == 93)).all()):
        return None
    brackets = np.flatnonzero(buf == 91)
    if len(brackets) != n:
        return None
    num_hashes = np.where(middle > 0, middle // 2 + 1, is_digit[brackets + 1])
    per_line = num_hashes + 3
    if len(run_start) != int(per_line.sum()):  # every slot holds one number (at most one: the skeleton)
        return None
    values = _run_values(buf, run_start, run_end)
    first = np.cumsum(per_line) - per_line  # index of each line's timestamp in values
    is_hash = np.ones(len(values), dtype=bool)
    for k in range(3):
        is_hash[first + k] = False
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(num_hashes, out=offsets[1:])
    return values[first] / 1000.0, values[first + 1], values[first + 2], values[is_hash], offsets


_ZERO_PAD = np.array([(1 << (8 * (8 - k))) - 1 if k < 8 else 0 for k in range(9)], dtype=np.uint64)
"""_ZERO_PAD[k]: the low 8 - k bytes of a little-endian word, those before a k-digit run ending it."""


def _run_values(buf: np.ndarray, run_start: np.ndarray, run_end: np.ndarray) -> np.ndarray:
    """The integer each digit run (at most 16 digits) spells: 8 digits per uint64 word at a time."""
    words = np.ndarray((len(buf) - 7,), dtype="<u8", buffer=buf, strides=(1,))  # the 8 bytes from each offset
    values = _word(words, run_start, run_end)
    long = np.flatnonzero(run_end - run_start > 8)
    if len(long):
        hi = _word(words, run_start[long], run_end[long] - 8)
        values[long] += hi * np.uint64(100_000_000)
    return values.astype(np.int64)


def _word(words: np.ndarray, run_start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """The digits of each run in [max(start, end - 8), end) as a number (SWAR: 3 multiply-adds)."""
    k = np.clip(end - run_start, 0, 8)  # digits of the run inside this word
    word = words[np.maximum(end - 8, 0)]
    pad = _ZERO_PAD[k]
    word = (word & ~pad) | (np.uint64(0x3030303030303030) & pad)  # bytes before the run read as '0'
    word -= np.uint64(0x3030303030303030)
    word = (word * np.uint64(10) + (word >> np.uint64(8))) & np.uint64(0x00FF00FF00FF00FF)
    word = (word * np.uint64(100) + (word >> np.uint64(16))) & np.uint64(0x0000FFFF0000FFFF)
    return (word * np.uint64(10000) + (word >> np.uint64(32))) & np.uint64(0xFFFFFFFF)


def parse_csv(block: bytes, width: int, columns: tuple[int, int, int], iso_time: bool) -> tuple[np.ndarray, ...] | None:
    """CSV lines of `width` unquoted fields -> (timestamp_s, input, output) from the `columns`
    (time, input, output). `iso_time`: `YYYY-MM-DD HH:MM:SS[.fraction]` (UTC), else seconds."""
    if b"\r" in block:  # Windows line ends (the released Azure files have them)
        block = block.replace(b"\r\n", b"\n")
    if b'"' in block or b"\r" in block:
        return None
    buf = np.frombuffer(block, dtype=np.uint8)
    n = block.count(b"\n")
    newlines = np.flatnonzero(buf == 10)
    commas = np.flatnonzero(buf == 44)
    if len(commas) != n * (width - 1) or not np.all(
            np.searchsorted(newlines, commas).reshape(n, width - 1) == np.arange(n)[:, None]):
        return None
    fields = block.replace(b"\n", b",").split(b",")
    i_t, i_in, i_out = columns
    try:
        n_in = np.array(fields[i_in::width][:n]).astype(np.int64)
        n_out = np.array(fields[i_out::width][:n]).astype(np.int64)
        ts = np.array(fields[i_t::width][:n])
        if iso_time:
            raw = ts.view(np.uint8).reshape(n, ts.dtype.itemsize)
            if raw.shape[1] < 19 or not (np.all(raw[:, [4, 7]] == 45) & np.all((raw[:, 10] == 32) | (raw[:, 10] == 84))
                                         & np.all(raw[:, [13, 16]] == 58) & np.all(raw[:, 18] != 0)):
                return None
            tail = raw[:, 19:]
            if not np.all((tail == 0) | (tail == 46) | ((tail >= 48) & (tail <= 57))):
                return None
            t = ts.astype("datetime64[ns]").astype(np.int64) / 1e9
        else:
            t = ts.astype(np.float64)
    except ValueError:
        return None
    if (n_in < 0).any() or (n_out < 0).any():
        return None
    return t, n_in, n_out
