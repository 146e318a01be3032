"""`EngineClient`: what callers (evaluate, serve, bench) use to talk to an engine worker.

The interface knows nothing of the transport: a subclass supplies `call(request, timeout_s)`
and every typed method follows from it, so an engine worker can later be a Ray actor. The zmq
implementation connects a DEALER socket to the worker's ROUTER over a unix socket and signs every
request with the worker's key (`athanor.engine.auth`; the worker drops what does not verify); any
number of clients holding the key may connect to one worker, whose requests it serves in arrival
order.

Replies are data: a candidate that fails gives a reply whose `status` says how. Only a worker
that does not answer at all raises (`EngineDied`).
"""

from __future__ import annotations

import itertools
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import torch
import zmq

from athanor.engine import auth
from athanor.engine import protocol as p
from athanor.engine.candidate import Candidate
from athanor.errors import CandidateError, ConfigError, EngineDied

R = TypeVar("R")


class EngineLost(EngineDied):
    """The worker stopped answering: `reason` is "timeout" or "crashed"."""

    def __init__(self, message: str, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


class EngineClient(ABC):
    """Typed RPCs to one engine worker (docs/architecture.md, "The engine RPC")."""

    @abstractmethod
    def call(self, request: Any, timeout_s: float | None = None) -> Any:
        """Send one request dataclass and return its reply dataclass."""

    def close(self) -> None:  # noqa: B027 (optional for transports without resources)
        """Release the transport (does not stop the worker)."""

    def health(self) -> p.HealthReply:
        return self.call(p.HealthRequest())

    def stats(self) -> p.StatsReply:
        return self.call(p.StatsRequest())

    def swap(self, candidate: Candidate, *, keep_incumbent: bool = False, timeout_s: float | None = None
             ) -> p.SwapReply:
        """Build `candidate` and make it active; with `keep_incumbent` the previous one stays resident."""
        return self.call(p.SwapRequest(candidate, keep_incumbent), timeout_s)

    def activate(self, candidate_id: str) -> p.AckReply:
        """Make a resident candidate active without rebuilding it."""
        return self.call(p.ActivateRequest(candidate_id))

    def drop(self, candidate_id: str) -> p.AckReply:
        return self.call(p.DropRequest(candidate_id))

    def run(self, request: p.RunRequest, timeout_s: float | None = None) -> p.RunReply:
        return self.call(request, timeout_s)

    def decode(self, tokens: Sequence[int], positions: Sequence[int], slots: Sequence[int], *,
               temperature: float = 0.0, top_p: float = 1.0, seed: int = 0, return_logits: bool = False,
               candidate_id: str | None = None) -> p.RunReply:
        """One decode step (seq_lens == positions, the plain case)."""
        n = len(tokens)
        return self.run(p.RunRequest(
            "decode", _long(tokens), _long(positions), _long(slots), _long(positions),
            torch.full((n,), temperature), torch.full((n,), top_p), torch.full((n,), seed, dtype=torch.long),
            return_logits=return_logits, candidate_id=candidate_id))

    def prefill(self, prompts: Sequence[Sequence[int]], slots: Sequence[int], seq_lens: Sequence[int] | None = None,
                *, temperature: float = 0.0, top_p: float = 1.0, seed: int = 0, return_logits: bool = False,
                candidate_id: str | None = None) -> p.RunReply:
        """Prefill (or continue) `prompts` into `slots`, each starting at its `seq_lens` entry."""
        starts = list(seq_lens or [0] * len(prompts))
        cu = list(itertools.accumulate((len(q) for q in prompts), initial=0))
        positions = [s + i for q, s in zip(prompts, starts, strict=True) for i in range(len(q))]
        n = len(prompts)
        return self.run(p.RunRequest(
            "prefill", _long([t for q in prompts for t in q]), _long(positions), _long(slots), _long(starts),
            torch.full((n,), temperature), torch.full((n,), top_p), torch.full((n,), seed, dtype=torch.long),
            cu_seqlens=_long(cu), return_logits=return_logits, candidate_id=candidate_id))

    def generate(self, prompts: Sequence[Sequence[int]], max_new_tokens: int, *, temperature: float = 0.0,
                 top_p: float = 1.0, seed: int = 0, candidate_id: str | None = None,
                 timeout_s: float | None = None) -> p.GenerateReply:
        """Prefill and decode inside the engine (one RPC, not one per step)."""
        req = p.GenerateRequest(tuple(tuple(q) for q in prompts), max_new_tokens, temperature, top_p, seed,
                                candidate_id)
        return self.call(req, timeout_s)

    def measure(self, spec: p.MeasureRequest, timeout_s: float | None = None) -> p.MeasureReply:
        return self.call(spec, timeout_s)

    def shutdown(self) -> p.AckReply:
        return self.call(p.ShutdownRequest())


def _long(values: Sequence[int]) -> torch.Tensor:
    return torch.tensor(list(values), dtype=torch.long)


def check(reply: R) -> R:
    """`reply` when its status is ok; otherwise the matching AthanorError (for CLI-style callers)."""
    status, error = getattr(reply, "status", "ok"), getattr(reply, "error", "")
    if status == "ok":
        return reply
    if status == "invalid":
        raise ConfigError(error)
    raise CandidateError(f"{status}: {error}")


class ZmqEngineClient(EngineClient):
    """An EngineClient over zmq; thread-safe (one request in flight per client at a time).

    `key` is the worker's request key (`Supervisor.client_key`, or `Supervisor.connect()`); requests
    signed with any other key are dropped by the worker, so the client sees a timeout."""

    def __init__(self, socket_path: str, *, key: bytes, timeout_s: float = 60.0,
                 context: zmq.Context | None = None) -> None:
        if len(key) != auth.KEY_BYTES:
            raise ValueError(f"an engine key has {auth.KEY_BYTES} bytes, not {len(key)}")
        self.endpoint = f"ipc://{socket_path}"
        self.key = key
        self.timeout_s = timeout_s
        self._ctx = context or zmq.Context.instance()
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self._sock = self._connect()

    def _connect(self) -> zmq.Socket:
        sock = self._ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(self.endpoint)
        return sock

    def reconnect(self) -> None:
        """A fresh socket: nothing queued for a dead worker is delivered to its successor."""
        with self._lock:
            self._sock.close(linger=0)
            self._sock = self._connect()

    def call(self, request: Any, timeout_s: float | None = None) -> Any:
        return self.call_checked(request, timeout_s, None)

    def call_checked(self, request: Any, timeout_s: float | None, is_alive: Callable[[], bool] | None) -> Any:
        """Like `call`, but polls `is_alive` while waiting so a dead worker is noticed at once."""
        timeout = self.timeout_s if timeout_s is None else timeout_s
        name = type(request).__name__
        with self._lock:
            request_id = next(self._ids)
            self._sock.send_multipart(auth.sign(self.key, p.encode(request, request_id)), copy=False)
            deadline = time.monotonic() + timeout
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise EngineLost(f"engine at {self.endpoint} did not answer {name} within {timeout:.0f}s", "timeout")
                if self._sock.poll(int(min(left, 0.05) * 1000) + 1):
                    frames = self._sock.recv_multipart()
                    try:
                        reply_id, reply = p.decode(frames)
                    except p.ProtocolError as e:
                        raise EngineDied(f"engine at {self.endpoint} sent a bad reply to {name}: {e}") from None
                    if reply_id == request_id or reply_id == 0:
                        return reply
                    continue  # a late reply to a request that timed out earlier
                if is_alive is not None and not is_alive():
                    raise EngineLost(f"engine worker died while handling {name}", "crashed")

    def close(self) -> None:
        self._sock.close(linger=0)
