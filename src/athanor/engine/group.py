"""A layout group: the ranks of one TP/EP/DCP replica, each a process holding its shard of the model, in lockstep.

Rank 0 is the engine its caller talks to (a worker's RPC loop, a server's step loop). Every call that runs the model
or changes what is resident is published to the other ranks before rank 0 makes it (`Group.publish`, a broadcast
over the group's gloo connection), and each follower makes the same call on its own shard (`follow`), so every
collective of the forward meets its peers. A swap is all or none (`Engine.swap`): every rank builds, the ranks agree
(`Group.agree`) before any of them runs a step of it, and a candidate that failed on one rank is dropped on all,
leaving each on its incumbent.

Followers are started by rank 0 once it is in its sandbox (`spawn_followers`), so they inherit its namespaces,
Landlock domain and dropped capabilities, and talk to it over the loopback of its private network namespace.
"""

from __future__ import annotations

import datetime
import logging
import os
import subprocess
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from athanor.engine.config import EngineConfig
from athanor.errors import ConfigError

if TYPE_CHECKING:
    from athanor.engine.core import Engine
    from athanor.engine.graphs import StepInputs
    from athanor.model import PrefillBatch

log = logging.getLogger(__name__)

GROUP_TIMEOUT_S = 120.0
"""A collective that waits longer than this fails (a rank that died or diverged), rather than hanging the group."""


@dataclass(frozen=True)
class Group:
    """This process's place in its layout group (size 1: an engine alone)."""

    rank: int = 0
    size: int = 1

    def agree(self, error: str) -> list[str]:
        """Every rank's `error` ("" for none), in rank order; every rank must call it at the same point."""
        if self.size == 1:
            return [error]
        import torch.distributed as dist

        errors: list[Any] = [None] * self.size
        dist.all_gather_object(errors, error)
        return [str(e) for e in errors]

    def publish(self, op: object) -> None:
        """Rank 0: send `op` to every follower (which `receive` it in order)."""
        if self.size > 1:
            import torch.distributed as dist

            dist.broadcast_object_list([op], src=0)

    def receive(self) -> object:
        import torch.distributed as dist

        box: list[Any] = [None]
        dist.broadcast_object_list(box, src=0)
        return box[0]


ALONE = Group()


# -- what rank 0 publishes ---------------------------------------------------------------------------
@dataclass(frozen=True)
class Call:
    """An engine RPC (`athanor.engine.protocol`), which every rank handles alike."""

    request: Any


@dataclass(frozen=True)
class Pages:
    candidate_id: str
    updates: Any
    """`athanor.serve.kv_pages` updates for the candidate's block table."""


@dataclass(frozen=True)
class Decode:
    candidate_id: str
    inputs: StepInputs
    greedy: bool


@dataclass(frozen=True)
class Prefill:
    candidate_id: str
    batch: PrefillBatch


@dataclass(frozen=True)
class Configure:
    """Rank 0 changed its engine's config (the server sizes the KV pool before building its incumbent)."""

    config: EngineConfig


@dataclass(frozen=True)
class Close:
    pass


@dataclass(frozen=True)
class Stop:
    pass


def call(engine: Engine, request: Any) -> Any:
    """`engine.handle(request)` on rank 0 and, published first, on every other rank of its group."""
    engine.group.publish(Call(request))
    return engine.handle(request)


def configure(engine: Engine, config: EngineConfig) -> None:
    engine.group.publish(Configure(config))
    engine.config = config


def close(engine: Engine) -> None:
    engine.group.publish(Close())
    engine.close()


def group_size(config: EngineConfig) -> int:
    """Processes one replica of `config.layout` runs on: the TP ranks, over which EP and DCP also spread."""
    degrees = config.layout
    name = _spelled(degrees)
    if degrees.get("dp", 1) > 1 or degrees.get("pp", 1) > 1:
        raise ConfigError(f"--layout {name}: an engine runs TP, EP and DCP ranks; DP replicas and PP stages are not "
                          "built into it")
    size = max(degrees.values(), default=1)
    for key, degree in degrees.items():
        if size % degree:
            raise ConfigError(f"--layout {name}: {key}={degree} must divide the group's {size} ranks")
    return size


def _spelled(degrees: dict[str, int]) -> str:
    return ",".join(f"{k}={v}" for k, v in degrees.items())


def check_layout(config: EngineConfig) -> int:
    """The group's size, once every rank's shard of the model is known to exist (a ConfigError naming the shape that
    does not divide, before any process starts)."""
    from athanor.model.registry import load_spec
    from athanor.model.shard import shard_spec

    size = group_size(config)
    if size > 1 and config.device.startswith("cuda"):
        raise ConfigError(f"--layout {_spelled(config.layout)}: ranks of one replica run on the CPU (gloo) for now; "
                          "NCCL ranks on several GPUs are not built")
    if size > 1:
        spec = load_spec(config.model)
        for rank in range(size):
            shard_spec(spec, config.layout.get("tp", 1), config.layout.get("ep", 1), rank)
    return size


def start(config: EngineConfig, rank: int) -> Group:
    """Join the group's gloo process group (rank 0 waits for every follower) over loopback."""
    size = group_size(config)
    if size == 1:
        return ALONE
    import torch.distributed as dist

    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    rendezvous = config.scratch() / "group-rendezvous"
    dist.init_process_group("gloo", init_method=f"file://{rendezvous}", rank=rank, world_size=size,
                            timeout=datetime.timedelta(seconds=GROUP_TIMEOUT_S))
    return Group(rank, size)


def spawn_followers(config: EngineConfig) -> list[subprocess.Popen[bytes]]:
    """Rank 0: start ranks 1.. as children (`python -m athanor.engine.follower CONFIG RANK`) in this process's
    sandbox."""
    scratch = config.scratch()
    scratch.mkdir(parents=True, exist_ok=True)
    (scratch / "group-rendezvous").unlink(missing_ok=True)  # a store left by an earlier group would join wrong peers
    path = scratch / "group-config.json"
    path.write_text(config.to_json())
    return [subprocess.Popen([sys.executable, "-m", "athanor.engine.follower", str(path), str(rank)],
                             stdin=subprocess.DEVNULL) for rank in range(1, group_size(config))]


def follow(engine: Engine, group: Group) -> None:
    """A follower's loop: make every call rank 0 publishes on this rank's shard, until told to stop."""
    from athanor.engine.pages import write_pages

    while True:
        op = group.receive()
        try:
            if isinstance(op, Stop):
                return
            if isinstance(op, Call):
                engine.handle(op.request)
            elif isinstance(op, Configure):
                engine.config = op.config
            elif isinstance(op, Close):
                engine.close()
            elif isinstance(op, Pages):
                write_pages(engine.residents[op.candidate_id].ctx.table, op.updates)
            elif isinstance(op, Decode):
                with engine.armed():
                    engine.residents[op.candidate_id].runner.step(op.inputs, greedy=op.greedy)
            elif isinstance(op, Prefill):
                with engine.armed():
                    engine.residents[op.candidate_id].forward.prefill(op.batch)
        except Exception:  # rank 0 meets the same failure, or times out in the collective this rank skipped
            log.exception("rank %d: %s failed", group.rank, type(op).__name__)
