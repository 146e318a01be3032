"""Messages between the front end and the serving worker: typed, frozen, JSON on the wire.

One zmq frame per message: `{"type": NAME, "fields": {...}}`. JSON, never pickle (the worker runs
candidate code). Token ids travel as lists of ints; no tensors cross this boundary.

front end -> worker: `Submit`, `Abort`, `Deploy`, `StatusQuery`, `Shutdown`.
worker -> front end: `Status` (the answer to `StatusQuery`; the first one says the worker is up), `StepReport` (one per step that produced tokens,
carrying every request's new tokens), `Rejected`, `Status`, `DeploymentState` (on every phase change).
"""

from __future__ import annotations

import dataclasses
import functools
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
    logprobs: int = -1
    """Log-probabilities returned with each generated token: -1 none; k >= 0 the token's own and the k most likely
    tokens' (the model's raw distribution, before temperature and top-p)."""


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
    logprobs: tuple[float, ...] = ()
    """With `Submit.logprobs` >= 0: each new token's log-probability."""
    top_ids: tuple[int, ...] = ()
    """With `Submit.logprobs` = k > 0: the k most likely tokens at each new token's step, k per token in order."""
    top_logprobs: tuple[float, ...] = ()
    """Their log-probabilities, as `top_ids`."""


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


NESTED: dict[type, dict[str, type]] = {StepReport: {"outputs": TokenOutput}, Status: {"deployment": DeploymentState}}
"""Fields that hold messages (one, or a tuple of them): everything else is a JSON value, a tuple or a dict."""


def _plain(message: Any) -> dict[str, Any]:
    # vars(), not dataclasses.asdict: the latter deep-copies every value, several times slower on a step's report
    # of hundreds of outputs, in the worker's loop between steps.
    out = dict(vars(message))
    for name in NESTED.get(type(message), ()):
        value = out[name]
        if isinstance(value, tuple):
            out[name] = [_plain(v) for v in value]
        elif value is not None:
            out[name] = _plain(value)
    return out


def encode(message: object) -> bytes:
    assert dataclasses.is_dataclass(message) and not isinstance(message, type)
    return json.dumps({"type": type(message).__name__, "fields": _plain(message)}).encode()


@functools.cache
def _field_names(cls: type) -> frozenset[str]:
    return frozenset(f.name for f in dataclasses.fields(cls))


def _tuple(values: list[Any]) -> tuple[Any, ...]:
    """A JSON array as the tuple it was sent as (nested arrays too: `Deploy.probes`)."""
    if values and isinstance(values[0], list):
        return tuple(_tuple(v) if isinstance(v, list) else v for v in values)
    return tuple(values)


def _build(cls: type, fields: dict[str, Any]) -> Any:
    names = _field_names(cls)
    values = {k: _tuple(v) if isinstance(v, list) else v for k, v in fields.items() if k in names}
    for name, inner in NESTED.get(cls, {}).items():
        raw = fields.get(name)
        if isinstance(raw, list):
            values[name] = tuple(_build(inner, o) for o in raw)
        elif raw:
            values[name] = _build(inner, raw)
    return cls(**values)


def decode(frame: bytes) -> Any:
    try:
        raw = json.loads(frame)
        cls = MESSAGE_TYPES[raw["type"]]
        return _build(cls, dict(raw.get("fields", {})))
    except (ValueError, KeyError, TypeError) as e:
        raise MessageError(f"not a serving message: {e!r}") from None
