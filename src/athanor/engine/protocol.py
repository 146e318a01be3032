"""The engine's wire format: typed, versioned request and reply messages.

Every message is a frozen dataclass registered here. On the wire a message is a zmq
multipart: one JSON header frame (protocol version, request id, type name, fields) and one
raw frame per tensor. JSON and raw bytes, never pickle: the worker runs untrusted candidate
code, and a compromised worker must not be able to run code in the supervisor by sending it
a crafted pickle. Only the types in `MESSAGE_TYPES` decode; anything else is a `ProtocolError`.

Every reply carries `status` (see `Status`) and `error`: a failing candidate is data, so the
engine answers with a status instead of raising across the process boundary.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import Tensor

from athanor.engine.candidate import Candidate, CandidateManifest

PROTOCOL_VERSION = 2

Status = Literal["ok", "error", "invalid", "crashed", "timeout", "violation"]
"""ok: done. error: the candidate raised (incumbent kept). invalid: the request itself is wrong
(unknown RPC, slot out of range, ...). crashed / timeout: the worker died or wedged and was
respawned with the incumbent. violation: the candidate tried to leave its sandbox."""


class ProtocolError(Exception):
    """A frame that is not a message of this protocol version."""


# -- requests ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class HealthRequest:
    pass


@dataclass(frozen=True)
class StatsRequest:
    pass


@dataclass(frozen=True)
class SwapRequest:
    candidate: Candidate
    keep_incumbent: bool = False
    """Keep the current candidate resident beside the new one (for A/B interleaving)."""


@dataclass(frozen=True)
class ActivateRequest:
    candidate_id: str


@dataclass(frozen=True)
class DropRequest:
    candidate_id: str


@dataclass(frozen=True)
class RunRequest:
    """One prefill or decode step over slots, sampled inside the engine.

    kind "decode": tokens, positions, slots, seq_lens are [B] int64.
    kind "prefill": tokens, positions are [T]; cu_seqlens [B+1]; slots, seq_lens [B].
    temperature, top_p: [B] float32 (temperature 0 is greedy); seeds: [B] int64.
    """

    kind: str
    tokens: Tensor
    positions: Tensor
    slots: Tensor
    seq_lens: Tensor
    temperature: Tensor
    top_p: Tensor
    seeds: Tensor
    cu_seqlens: Tensor | None = None
    return_logits: bool = False
    candidate_id: str | None = None
    """Run on this resident candidate instead of the active one."""


@dataclass(frozen=True)
class GenerateRequest:
    """Prefill `prompts` into slots 0..n-1 and decode inside the engine (no RPC per step)."""

    prompts: tuple[tuple[int, ...], ...]
    max_new_tokens: int
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int = 0
    candidate_id: str | None = None


@dataclass(frozen=True)
class MeasureRequest:
    """Time `iters` steps of `kind` at `batch_size` rows and `context_len` cached tokens."""

    kind: str = "decode"
    batch_size: int = 1
    context_len: int = 16
    iters: int = 10
    warmup: int = 2
    candidate_id: str | None = None


@dataclass(frozen=True)
class ShutdownRequest:
    pass


@dataclass(frozen=True)
class ScriptStep:
    """One step of a trajectory (the fields of a RunRequest, greedy), plus what the evaluator scores.

    next_tokens: [B] int64, the scripted token after this step's last one (its log-probability is
    fingerprinted); keep_logits: return this step's full logits too.
    """

    kind: str
    tokens: Tensor
    positions: Tensor
    slots: Tensor
    seq_lens: Tensor
    cu_seqlens: Tensor | None = None
    next_tokens: Tensor | None = None
    keep_logits: bool = False
    shared: Tensor | None = None
    """[3] int64 (source slot, slot, pages): for this step only, the slot's first `pages` block-table entries are
    the source slot's, a prefix it shares as a server's prefix cache shares one; it reads keys it never wrote."""


@dataclass(frozen=True)
class TrajectoryRequest:
    """Run `steps` on each of `candidate_ids`, interleaved per step in a seeded random order, every
    run timed, poisoned and fingerprinted (see `athanor.engine.trajectory`)."""

    candidate_ids: tuple[str, ...]
    steps: tuple[ScriptStep, ...]
    seed: int = 0
    num_projections: int = 8
    poison: bool = True
    logits_of: tuple[str, ...] = ()
    """The listed candidates whose kept logits come back, in this order (empty: every one's). Full logits
    are megabytes a row; the evaluator compares only the challenger's, so the incumbent's two runs send
    fingerprints alone."""


@dataclass(frozen=True)
class StepRequest:
    """Run one scripted step on one resident, timed, poisoned and fingerprinted (`athanor.engine.stepwise`).

    The evaluator drives an interleaved trajectory a step at a time across worker processes, so step k's inputs
    reach a worker only after its outputs of step k-1 have left it. `step` carries no next tokens (they are the
    next step's inputs): they come with the following request as `score_next`, scored against the logits the
    worker kept from this resident's last step. `step=None` only scores; `collect` runs the garbage collector
    after (the evaluator asks for it once a trajectory is over, outside every timed step)."""

    candidate_id: str
    step: ScriptStep | None = None
    score_next: Tensor | None = None
    seed: int = 0
    num_projections: int = 8
    poison: bool = True
    return_logits: bool = False
    collect: bool = False


@dataclass(frozen=True)
class ProbeRequest:
    """Integrity figures of the worker: weights digest, tampered names, candidate threads, bandwidth."""

    bandwidth: bool = False
    shards: str = ""
    """A layout's name (tp2): the digest is the one a group of that layout holding this model's shards has."""


# -- replies ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class HealthReply:
    status: Status = "ok"
    error: str = ""
    pid: int = 0
    protocol_version: int = PROTOCOL_VERSION
    active_candidate: str = ""
    device: str = ""
    sandbox: tuple[str, ...] = ()
    """What the sandbox enforces, one line per mechanism ("network: netns", ...)."""


@dataclass(frozen=True)
class StatsReply:
    status: Status = "ok"
    error: str = ""
    active_candidate: str = ""
    resident: tuple[str, ...] = ()
    swap_count: int = 0
    rss_bytes: int = 0
    device_allocated_bytes: int = 0
    candidate_state_bytes: int = 0
    """Bytes the resident candidates allocated through `ctx.allocate` (their KV caches)."""
    model_bytes: int = 0
    violations: int = 0


@dataclass(frozen=True)
class SwapReply:
    status: Status = "ok"
    error: str = ""
    candidate_id: str = ""
    violations: tuple[str, ...] = ()
    graph_safe: bool = False
    build_s: float = 0.0
    capture_s: float = 0.0
    first_step_s: float = 0.0
    total_s: float = 0.0
    """Candidate received to graphs captured and first decode step done (worker side)."""
    replaced: tuple[str, ...] = ()
    """Guarded functions or namespace entries (timing, comparison, athanor's) the candidate replaced while it
    was imported, built and first run; the engine has undone them, the evaluator rejects the candidate."""


@dataclass(frozen=True)
class AckReply:
    status: Status = "ok"
    error: str = ""


@dataclass(frozen=True)
class RunReply:
    status: Status = "ok"
    error: str = ""
    next_tokens: Tensor | None = None  # [B] int64
    logits: Tensor | None = None  # [B, vocab] fp32, when asked for
    elapsed_s: float = 0.0
    used_graph: bool = False


@dataclass(frozen=True)
class GenerateReply:
    status: Status = "ok"
    error: str = ""
    tokens: tuple[tuple[int, ...], ...] = ()
    elapsed_s: float = 0.0


@dataclass(frozen=True)
class MeasureReply:
    status: Status = "ok"
    error: str = ""
    times_s: tuple[float, ...] = ()
    used_graph: bool = False


@dataclass(frozen=True)
class TrajectoryReply:
    status: Status = "ok"
    error: str = ""
    times_s: Tensor | None = None  # [C, S] float64, seconds per step and candidate
    fingerprints: Tensor | None = None  # [C, R, P + 4] fp32, R = rows of all steps in order
    tokens: Tensor | None = None  # [C, R] int64 argmax
    logits: Tensor | None = None  # [L, K, V] fp32 of the request's logits_of (or all C), steps marked keep_logits
    used_graph: bool = False
    violations: tuple[str, ...] = ()
    host_s: tuple[tuple[str, float], ...] = ()  # where the worker's wall went: (phase, seconds), see run_trajectory


@dataclass(frozen=True)
class StepReply:
    status: Status = "ok"
    error: str = ""
    seconds: float = 0.0  # the worker's own measure of the step (device events on CUDA, its clock on CPU)
    fingerprint: Tensor | None = None  # [B, P + 4] fp32; log p(next) is NaN until the next request scores it
    tokens: Tensor | None = None  # [B] int64 argmax
    logits: Tensor | None = None  # [B, V] fp32 when asked for
    scored: Tensor | None = None  # [B'] log p of `score_next` under the resident's previous step's logits
    used_graph: bool = False
    violations: tuple[str, ...] = ()


@dataclass(frozen=True)
class ProbeReply:
    status: Status = "ok"
    error: str = ""
    weights_digest: str = ""
    tampered: tuple[str, ...] = ()
    foreign_threads: tuple[str, ...] = ()
    bandwidth_bytes_per_s: float = 0.0
    resident: tuple[str, ...] = ()


REPLY_FOR: dict[type, type] = {
    HealthRequest: HealthReply,
    StatsRequest: StatsReply,
    SwapRequest: SwapReply,
    ActivateRequest: AckReply,
    DropRequest: AckReply,
    RunRequest: RunReply,
    GenerateRequest: GenerateReply,
    MeasureRequest: MeasureReply,
    ShutdownRequest: AckReply,
    TrajectoryRequest: TrajectoryReply,
    ProbeRequest: ProbeReply,
    StepRequest: StepReply,
}
"""The reply type of each request type (a synthesized crash reply uses it too)."""

MESSAGE_TYPES: dict[str, type] = {
    cls.__name__: cls
    for cls in (*REPLY_FOR, AckReply, HealthReply, StatsReply, SwapReply, RunReply, GenerateReply,
                MeasureReply, TrajectoryReply, ProbeReply, StepReply, ScriptStep, Candidate, CandidateManifest)
}


# -- encoding ---------------------------------------------------------------------------------
def _to_json(value: Any, frames: list[Any]) -> Any:
    if isinstance(value, Tensor):
        t = value.detach().to("cpu").contiguous()
        frames.append(t.view(torch.uint8).numpy() if t.numel() else b"")
        return {"__tensor__": len(frames) - 1, "dtype": str(t.dtype).removeprefix("torch."),
                "shape": list(t.shape)}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        name = type(value).__name__
        if MESSAGE_TYPES.get(name) is not type(value):
            raise ProtocolError(f"{name} is not a message type of protocol {PROTOCOL_VERSION}")
        fields = {f.name: _to_json(getattr(value, f.name), frames) for f in dataclasses.fields(value)}
        return {"__type__": name, "fields": fields}
    if isinstance(value, (list, tuple)):
        return [_to_json(v, frames) for v in value]
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    raise ProtocolError(f"cannot send a value of type {type(value).__name__}")


def _from_json(value: Any, frames: list[bytes]) -> Any:
    if isinstance(value, list):
        return tuple(_from_json(v, frames) for v in value)
    if not isinstance(value, dict):
        return value
    if "__tensor__" in value:
        dtype = getattr(torch, str(value["dtype"]), None)
        if not isinstance(dtype, torch.dtype):
            raise ProtocolError(f"unknown tensor dtype {value['dtype']!r}")
        raw = bytearray(memoryview(frames[int(value["__tensor__"])]).cast("B"))
        flat = torch.frombuffer(raw, dtype=torch.uint8) if raw else torch.empty(0, dtype=torch.uint8)
        return flat.view(dtype).reshape([int(s) for s in value["shape"]])
    cls = MESSAGE_TYPES.get(str(value.get("__type__")))
    if cls is None:
        raise ProtocolError(f"unknown message type {value.get('__type__')!r}")
    names = {f.name for f in dataclasses.fields(cls)}
    fields = {k: _from_json(v, frames) for k, v in dict(value.get("fields", {})).items() if k in names}
    try:
        return cls(**fields)
    except TypeError as e:
        raise ProtocolError(f"{cls.__name__}: {e}") from None


def encode(message: Any, request_id: int) -> list[Any]:
    """The zmq frames of `message` (header JSON first, then one frame per tensor)."""
    frames: list[Any] = []
    body = _to_json(message, frames)
    header = {"v": PROTOCOL_VERSION, "id": request_id, "body": body}
    return [json.dumps(header).encode(), *frames]


def decode(frames: list[bytes]) -> tuple[int, Any]:
    """(request id, message) from frames made by `encode`; ProtocolError when they are not."""
    if not frames:
        raise ProtocolError("empty message")
    try:
        header = json.loads(frames[0])
    except (ValueError, UnicodeDecodeError) as e:
        raise ProtocolError(f"header is not JSON ({e})") from None
    if not isinstance(header, dict) or header.get("v") != PROTOCOL_VERSION:
        got = header.get("v") if isinstance(header, dict) else None
        raise ProtocolError(f"protocol version {got!r}, this side speaks {PROTOCOL_VERSION}")
    try:
        return int(header.get("id", 0)), _from_json(header.get("body"), list(frames[1:]))
    except (IndexError, KeyError, ValueError, RuntimeError) as e:
        raise ProtocolError(f"malformed message ({e})") from None


def reply_type(request: Any) -> type:
    """The reply dataclass for `request` (AckReply for unknown requests)."""
    return REPLY_FOR.get(type(request), AckReply)


def failure(request: Any, status: Status, error: str) -> Any:
    """A reply of the right type for `request` that says it failed."""
    return reply_type(request)(status=status, error=error)

