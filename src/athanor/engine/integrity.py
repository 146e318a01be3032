"""What the evaluator's probe checks before and after a candidate runs (`ProbeRequest`): a digest of the weights,
the namespaces a candidate changed (timing and comparison functions included), threads started by candidate code,
and the device's measured memory bandwidth at the model's working-set size.

A layout group's digest is every rank's shard digest in rank order, hashed together (each rank computes its own at
the same published probe), so a candidate that changes the weights of any rank changes it. The trusted reference
engine, one device holding the whole model, computes the digest a group of a given layout must have from views of
its own weights (`ProbeRequest.shards`): the expected figure never comes from a process candidate code ran in.
"""

from __future__ import annotations

import hashlib
import time
from typing import TYPE_CHECKING

import torch

from athanor.engine import protocol as p
from athanor.engine.trajectory import foreign_threads, tampered
from athanor.model import Model

if TYPE_CHECKING:
    from athanor.engine.core import Engine

# Bound at import, before any candidate runs: rebinding the module attributes later changes nothing here.
_clock = time.perf_counter
_cuda_sync = torch.cuda.synchronize


def weights_digest(model: Model, chunk: int = 1 << 24) -> str:
    """sha256 over every weight's name, dtype, shape and two exact integer checksums of its bits.

    Computed on the device (a copy of 2.5 GB to the host per check would cost more than the check).
    """
    h = hashlib.sha256()
    int_of = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
    for name in sorted(model.weights):
        t = model.weights[name].detach()
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        flat = t.contiguous().reshape(-1).view(int_of[t.element_size()])
        plain = weighted = 0
        for start in range(0, flat.numel(), chunk):
            x = flat[start:start + chunk].to(torch.int64)
            idx = torch.arange(start, start + x.numel(), dtype=torch.int64, device=x.device)
            plain += int(x.sum())
            weighted += int((x * ((idx * 2654435761) % 2147483647 + 1)).sum())
        h.update(f"{plain}:{weighted};".encode())
    return h.hexdigest()


def group_digest(rank_digests: list[str]) -> str:
    """One digest of a layout group's weights from its ranks' shard digests, in rank order."""
    return hashlib.sha256("|".join(rank_digests).encode()).hexdigest()


def shards_digest(model: Model, layout: str) -> str:
    """The digest a layout group of `layout` (`athanor plan`'s name, e.g. tp2) holding `model`'s shards has."""
    from athanor.engine.config import parse_layout
    from athanor.model.shard import shard_model

    degrees = parse_layout(layout)
    ranks = max(degrees.values(), default=1)
    tp, ep = degrees.get("tp", 1), degrees.get("ep", 1)
    return group_digest([weights_digest(shard_model(model, rank, tp, ep)) for rank in range(ranks)])


def bandwidth(device: torch.device, nbytes: int, reps: int = 5) -> float:
    """Best copy bandwidth (bytes read + written per second) over a buffer of `nbytes` (the working set)."""
    n = max(nbytes, 1 << 20) // 4
    src = torch.ones(n, dtype=torch.float32, device=device)
    dst = torch.empty_like(src)
    best = float("inf")
    for _ in range(reps):
        if device.type == "cuda":
            _cuda_sync(device)
        t = _clock()
        dst.copy_(src)
        if device.type == "cuda":
            _cuda_sync(device)
        best = min(best, _clock() - t)
    return 2 * n * 4 / max(best, 1e-9)


def probe(engine: Engine, req: p.ProbeRequest) -> p.ProbeReply:
    """The integrity figures; every rank of a group runs it (the probe is published) and rank 0 reports them all."""
    bw = bandwidth(engine.device, engine.model.nbytes()) if req.bandwidth else 0.0
    if req.shards:
        digest = shards_digest(engine.model, req.shards)
    elif engine.group.size > 1:
        digest = group_digest(engine.group.agree(weights_digest(engine.model)))
    else:
        digest = weights_digest(engine.model)
    return p.ProbeReply(weights_digest=digest, tampered=tuple(_every_rank(engine, tampered(engine))),
                        foreign_threads=tuple(_every_rank(engine, foreign_threads())), bandwidth_bytes_per_s=bw,
                        resident=tuple(engine.residents))


def _every_rank(engine: Engine, found: list[str]) -> list[str]:
    """What candidate code did on any rank of the group, each finding named by its rank (every rank calls it)."""
    if engine.group.size == 1:
        return found
    return [f"rank {r}: {x}" for r, text in enumerate(engine.group.agree("\n".join(found))) for x in text.splitlines()]
