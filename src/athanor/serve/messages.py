"""Messages between the front end and the serving worker: typed, frozen, JSON on the wire.

One zmq frame per message: `{"type": NAME, "fields": {...}}`. JSON, never pickle (the worker runs
candidate code). Token ids travel as lists of ints; no tensors cross this boundary.

front end -> worker: `Submit`, `Abort`, `Deploy`, `StatusQuery`, `Shutdown`.
worker -> front end: `Status` (the answer to `StatusQuery`; the first one says the worker is up), `StepReport` (one per step that produced tokens,
carrying every request's new tokens), `Rejected`, `Status`, `DeploymentState` (on every phase change).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Submit:
    """One generation request, already tokenized and validated by the front end."""

    request_id: str
    prompt: tuple[int, ...]
    max_tokens: int
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int = 0
    stop_ids: tuple[int, ...] = ()
    """Token ids that end the sequence (not returned). Stop *strings* are the front end's: it aborts."""


@dataclass(frozen=True)
class Abort:
    request_id: str


@dataclass(frozen=True)
class Deploy:
    """Start a canary deploy of a candidate (source and manifest as `athanor.engine.candidate.Candidate`)."""

    deploy_id: int
    source: str
    content_hash: str
    parent: str = ""
    author: str = ""
    description: str = ""
    probes: tuple[tuple[int, ...], ...] = ()
    """Token sequences (real text) the worker mirrors as probes when there is no live traffic to shadow."""


@dataclass(frozen=True)
class StatusQuery:
    pass


@dataclass(frozen=True)
class Shutdown:
    pass


@dataclass(frozen=True)
class TokenOutput:
    """New tokens of one request since the last report; `finish_reason` set on its last report."""

    request_id: str
    tokens: tuple[int, ...]
    finish_reason: str | None = None
    """None (more to come), "stop" (a stop id), "length" (max_tokens or the context), "abort", "error"."""
    error: str = ""
    candidate_id: str = ""
    """The candidate that prefilled the sequence (it stays there unless that candidate fails)."""


@dataclass(frozen=True)
class StepReport:
    outputs: tuple[TokenOutput, ...]
    num_decode_rows: int
    """Sequences in this step's decode batches (all candidates): the batch size."""
    num_prefill_tokens: int
    num_waiting: int
    num_running: int
    step_s: float
    num_preempted: int = 0
    """Sequences preempted (their pages taken back, to be recomputed) since the last report."""


@dataclass(frozen=True)
class Rejected:
    request_id: str
    error: str
    code: str = "invalid"
    """"queue_full" (back-pressure: retry later) or "invalid"."""


@dataclass(frozen=True)
class DeploymentState:
    """Where a deploy stands: phase building -> shadow -> live -> deployed, or rolled_back / failed."""

    deploy_id: int
    candidate_id: str
    incumbent_id: str
    phase: str
    reason: str = ""
    figures: dict[str, float] = field(default_factory=dict)
    started_at: float = 0.0
    updated_at: float = 0.0

    @property
    def finished(self) -> bool:
        return self.phase in ("deployed", "rolled_back", "failed")


@dataclass(frozen=True)
class Status:
    active_candidate: str
    resident: tuple[str, ...]
    num_waiting: int
    num_running: int
    pid: int = 0
    deployment: DeploymentState | None = None
    kv_pool_tokens: int = 0
    """Tokens each resident's KV pool holds."""


MESSAGE_TYPES: dict[str, type] = {cls.__name__: cls for cls in (
    Submit, Abort, Deploy, StatusQuery, Shutdown, TokenOutput, StepReport, Rejected, DeploymentState, Status)}


class MessageError(Exception):
    """A frame that is not one of these messages."""


def encode(message: object) -> bytes:
    assert dataclasses.is_dataclass(message) and not isinstance(message, type)
    return json.dumps({"type": type(message).__name__, "fields": dataclasses.asdict(message)}).encode()


def _build(cls: type, fields: dict[str, Any]) -> Any:
    names = {f.name for f in dataclasses.fields(cls)}
    values = {k: tuple(v) if isinstance(v, list) else v for k, v in fields.items() if k in names}
    if cls is StepReport:
        values["outputs"] = tuple(_build(TokenOutput, o) for o in fields.get("outputs", ()))
    if cls is Status and fields.get("deployment"):
        values["deployment"] = _build(DeploymentState, fields["deployment"])
    return cls(**values)


def decode(frame: bytes) -> Any:
    try:
        raw = json.loads(frame)
        cls = MESSAGE_TYPES[raw["type"]]
        return _build(cls, dict(raw.get("fields", {})))
    except (ValueError, KeyError, TypeError) as e:
        raise MessageError(f"not a serving message: {e!r}") from None
