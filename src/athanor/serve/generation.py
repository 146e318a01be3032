"""One request's life in the front end: submit, incremental detokenization, stop strings, timing, log.

The worker stops a sequence on a stop *id*; stop *strings* need text, so they are checked here on
the decoded output, and the worker is told to abort once one appears (a few tokens of work are
wasted; the client never sees them). Streamed text holds back a possible stop-string prefix and an
unfinished UTF-8 character until the next tokens settle them.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from athanor.serve.api import APIError
from athanor.serve.messages import Rejected, Submit, TokenOutput

if TYPE_CHECKING:
    from athanor.serve.frontend import WorkerHandle
    from athanor.serve.metrics import ServeMetrics
    from athanor.serve.reqlog import RequestLog

log = logging.getLogger(__name__)
_ids = itertools.count()


class Detokenizer(Protocol):
    def decode(self, ids: list[int], skip_special: bool = True) -> str: ...


@dataclass(frozen=True)
class GenerationParams:
    max_tokens: int
    temperature: float
    top_p: float
    seed: int
    stop: tuple[str, ...] = ()
    stop_ids: tuple[int, ...] = ()
    logprobs: int = -1
    """`Submit.logprobs`: -1 none; k >= 0 each token's log-probability and the k most likely tokens'."""


class Generation:
    def __init__(self, handle: WorkerHandle, tokenizer: Detokenizer, metrics: ServeMetrics,
                 request_log: RequestLog | None, prompt_ids: list[int], params: GenerationParams,
                 prompt_text: str | None = None, prefix: str = "cmpl") -> None:
        self.handle = handle
        self.tokenizer = tokenizer
        self.metrics = metrics
        self.request_log = request_log
        self.prompt_ids = prompt_ids
        self.params = params
        self.prompt_text = prompt_text
        self.request_id = f"{prefix}-{time.time_ns():x}{next(_ids):x}"
        self.output_ids: list[int] = []
        self.logprobs: list[float] = []
        """Per output token, its log-probability (with `params.logprobs` >= 0)."""
        self.top: list[list[tuple[int, float]]] = []
        """Per output token, the `params.logprobs` most likely tokens at its step and their log-probabilities."""
        self.finish_reason: str | None = None
        self.text = ""
        self._emitted = 0
        self._arrival_wall = time.time()
        self._arrival = time.perf_counter()
        self._first: float | None = None
        self._queue: asyncio.Queue[TokenOutput | Rejected] | None = None
        self._pending: TokenOutput | None = None
        self._recorded = False

    async def start(self) -> None:
        """Submit and wait for the first answer; an APIError when the worker refuses the request."""
        p = self.params
        self._queue = await self.handle.submit(Submit(self.request_id, tuple(self.prompt_ids), p.max_tokens,
                                                      p.temperature, p.top_p, p.seed, p.stop_ids, p.logprobs))
        first = await self._queue.get()
        if isinstance(first, Rejected):
            self._recorded = True
            self.metrics.requests.labels("rejected").inc()
            if first.code == "queue_full":
                raise APIError(429, first.error, type="rate_limit_error", code="queue_full")
            raise APIError(400, first.error)
        self._pending = first

    async def deltas(self) -> AsyncIterator[str]:
        """Text as it is generated (after `start`); `finish_reason` is set when it ends."""
        assert self._queue is not None
        try:
            while self.finish_reason is None:
                if self._pending is not None:
                    out, self._pending = self._pending, None
                else:
                    item = await self._queue.get()
                    assert isinstance(item, TokenOutput)
                    out = item
                piece = self._advance(out)
                if piece:
                    yield piece
            if out.finish_reason == "error":
                raise APIError(500, f"generation failed: {out.error or 'the engine failed'}", type="server_error",
                               code="engine_error")
        finally:
            if self.finish_reason is None:  # the client went away: stop the work
                await self.handle.abort(self.request_id)
                self.finish_reason = "abort"
            self._record()

    async def cancel(self) -> None:
        """Stop a started request whose tokens nobody will read (another choice of its request failed)."""
        if self.finish_reason is None:
            await self.handle.abort(self.request_id)
            self.finish_reason = "abort"
        self._record()

    async def complete(self) -> str:
        async for _ in self.deltas():
            pass
        return self.text

    def _advance(self, out: TokenOutput) -> str:
        if out.tokens and self._first is None:
            self._first = time.perf_counter()
        self.output_ids.extend(out.tokens)
        self.logprobs.extend(out.logprobs)
        k = self.params.logprobs
        if k > 0:
            pairs = list(zip(out.top_ids, out.top_logprobs, strict=True))
            self.top.extend(pairs[i:i + k] for i in range(0, len(pairs), k))
        text = self.tokenizer.decode(self.output_ids)
        finish = out.finish_reason
        stops = self.params.stop
        if stops:
            window = max(0, self._emitted - max(len(s) for s in stops))
            hits = [i for i in (text.find(s, window) for s in stops) if i >= 0]
            if hits:
                text, finish = text[:min(hits)], "stop"
                if out.finish_reason is None:  # the worker is still generating: stop it
                    self.handle.abort_soon(self.request_id)
        self.text = text
        if finish is not None:
            self.finish_reason = "length" if finish == "length" else ("stop" if finish in ("stop", "abort") else finish)
            end = len(text)
        else:
            end = len(text.rstrip("\ufffd"))  # an unfinished UTF-8 character waits for its next token
            if stops:
                end = min(end, len(text) - (max(len(s) for s in stops) - 1))
        piece = text[self._emitted:end] if end > self._emitted else ""
        self._emitted = max(self._emitted, end)
        return piece

    def _record(self) -> None:
        if self._recorded:
            return
        self._recorded = True
        e2e = time.perf_counter() - self._arrival
        ttft = None if self._first is None else self._first - self._arrival
        outcome = {"stop": "ok", "length": "ok", "abort": "aborted"}.get(self.finish_reason or "", "error")
        self.metrics.on_request(outcome, len(self.prompt_ids), ttft, e2e, len(self.output_ids))
        if self.request_log is not None and outcome != "error":
            self.request_log.write(self._arrival_wall, self.prompt_ids, len(self.output_ids), ttft, e2e,
                                   self.prompt_text)
