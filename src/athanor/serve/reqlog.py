"""The request log: one JSON line per finished request, in the `athanor` format `traffic/` reads.

Fields (`athanor.traffic.athanor_log_record`): timestamp (Unix seconds of arrival), input and output
lengths in tokens, `hash_ids` (prefix block hashes of 512-token blocks, chained so equal hashes mean
equal prefixes, as in the Mooncake trace), TTFT and end-to-end latency. No prompt text unless the
server runs with `--log-prompts`.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import IO

from athanor.traffic.formats import MOONCAKE_BLOCK_TOKENS, athanor_log_record

log = logging.getLogger(__name__)


def block_hashes(tokens: Sequence[int], block_tokens: int = MOONCAKE_BLOCK_TOKENS) -> list[int]:
    """One hash per block of `block_tokens` tokens (the last may be partial), each covering the whole prefix."""
    out: list[int] = []
    prev = b""
    for start in range(0, len(tokens), block_tokens):
        block = tokens[start:start + block_tokens]
        h = hashlib.blake2b(prev + b"".join(int(t).to_bytes(4, "little") for t in block), digest_size=8).digest()
        out.append(int.from_bytes(h, "little") >> 1)  # 63 bits: fits int64 columns
        prev = h
    return out


class RequestLog:
    def __init__(self, path: str | Path, log_prompts: bool = False) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.log_prompts = log_prompts
        self._file: IO[str] = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 (held for the server's life)
        self._lock = threading.Lock()

    def write(self, timestamp_s: float, prompt_ids: Sequence[int], num_output: int, ttft_s: float | None,
              latency_s: float, prompt_text: str | None = None) -> None:
        rec = athanor_log_record(timestamp_s, len(prompt_ids), num_output, block_hashes(prompt_ids), ttft_s, latency_s)
        if self.log_prompts and prompt_text is not None:
            rec["prompt"] = prompt_text
        line = json.dumps(rec) + "\n"
        with self._lock:
            self._file.write(line)
            self._file.flush()

    def close(self) -> None:
        with self._lock:
            self._file.close()
