"""The trace formats: detection, and one record of each format read into a `Row`.

- ``mooncake``: JSONL ``{"timestamp": ms, "input_length", "output_length", "hash_ids": [...]}``
  (Mooncake FAST'25 trace release; ``hash_ids`` name 512-token prefix blocks).
- ``azure``: CSV ``TIMESTAMP,ContextTokens,GeneratedTokens`` (Azure LLM inference traces 2023/2024).
- ``burstgpt``: CSV ``Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type``.
- ``athanor``: the JSONL request log athanor's server writes, one `athanor_log_record` per line.
- ``openai``: JSONL of OpenAI-style requests (``messages``; lengths from ``usage`` when present).

The row functions raise `KeyError`, `TypeError` or `ValueError` on a malformed record;
`describe_error` turns that into the one-line reason the reader reports with ``file:line``.
"""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from typing import Any

from athanor.errors import ConfigError

FORMATS = ("mooncake", "azure", "burstgpt", "athanor", "openai")
MOONCAKE_BLOCK_TOKENS = 512
"""Tokens per `hash_ids` block in the Mooncake trace (its README)."""
CHARS_PER_TOKEN = 4.0
"""OpenAI's rule of thumb for English text, used only when an OpenAI-style log has no `usage`."""


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


def describe_error(e: Exception) -> str:
    """The one-line reason a row parser's exception gives."""
    if isinstance(e, KeyError):
        return f"missing field {e.args[0]!r}"
    return str(e)


def count_field(value: Any, field: str) -> int:
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


def _optional_number(value: Any, field: str) -> float:
    return float("nan") if value is None else _number(value, field)


Row = tuple[float, int, int, "list[int] | None", "float | None", "float | None"]
"""(timestamp s, input tokens, output tokens, prefix block hashes, TTFT s, latency s) of one request."""


def mooncake_row(rec: dict[str, Any]) -> Row:
    """One Mooncake record (its timestamp in milliseconds)."""
    hashes = rec.get("hash_ids", [])
    if not isinstance(hashes, list):
        raise ValueError(f"field 'hash_ids' is {hashes!r}, expected a list of block ids")
    return (_number(rec["timestamp"], "timestamp") / 1000.0, count_field(rec["input_length"], "input_length"),
            count_field(rec["output_length"], "output_length"), hashes, None, None)


def athanor_row(rec: dict[str, Any]) -> Row:
    """One line of athanor's request log (`athanor_log_record`)."""
    hashes = rec.get("hash_ids") or []
    if not isinstance(hashes, list):
        raise ValueError(f"field 'hash_ids' is {hashes!r}, expected a list of block hashes")
    return (_number(rec["timestamp"], "timestamp"), count_field(rec["input_length"], "input_length"),
            count_field(rec["output_length"], "output_length"), hashes,
            _optional_number(rec.get("ttft_s"), "ttft_s"), _optional_number(rec.get("latency_s"), "latency_s"))


def openai_row(rec: dict[str, Any]) -> Row:
    """One OpenAI-style request: lengths from `usage`, else estimated from the messages and `max_tokens`."""
    messages = rec["messages"]
    if not isinstance(messages, list):
        raise ValueError(f"field 'messages' is {type(messages).__name__}, expected a list")
    t = rec.get("timestamp", rec.get("created", 0.0))
    usage = rec.get("usage") or {}
    if "prompt_tokens" in usage:
        n_in = count_field(usage["prompt_tokens"], "usage.prompt_tokens")
    else:  # no tokenizer here: estimate from characters, as OpenAI's guidance does
        chars = sum(len(str(m.get("content", ""))) for m in messages if isinstance(m, dict))
        n_in = max(1, round(chars / CHARS_PER_TOKEN))
    if "completion_tokens" in usage:
        n_out = count_field(usage["completion_tokens"], "usage.completion_tokens")
    else:
        n_out = count_field(rec.get("max_tokens", rec.get("max_completion_tokens", 0)), "max_tokens")
    return (_number(t, "timestamp"), n_in, n_out, None, None, None)


class IsoTime:
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
