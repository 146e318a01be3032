"""One scripted step at a time (`StepRequest`): the worker's half of a trajectory the evaluator interleaves.

The evaluator runs the incumbent, its twin and the challenger in separate worker processes and drives their
trajectory step by step (`athanor.evaluate.interleave`), so nothing of the script is in a worker's address space
before its turn: a step's next tokens (which are the next step's inputs) arrive with the following request and
are scored then, against the logits kept from this resident's previous step. Each run is poisoned, timed and
fingerprinted exactly as in `run_trajectory`, with the garbage collector off while it runs.
"""

from __future__ import annotations

import gc
from functools import lru_cache
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from athanor.engine import protocol as p
from athanor.engine.candidate import candidate_failure, collector_off
from athanor.engine.pages import shared_prefix
from athanor.engine.requests import BadRequest
from athanor.engine.trajectory import (
    StepTimer,
    check_greedy_tokens,
    fingerprint,
    fingerprint_projection,
    poison_outputs,
    validate_step,
)

if TYPE_CHECKING:
    from athanor.engine.core import Engine

_kept: dict[str, Tensor] = {}
"""Per resident, the fp32 logits of its last step, until the next request scores its next tokens."""
_timers: dict[int, StepTimer] = {}


@lru_cache(maxsize=4)
def _projection(vocab: int, num: int, seed: int, device: str) -> Tensor:
    return fingerprint_projection(vocab, num, seed, torch.device(device))


def _score(previous: Tensor, next_tokens: Tensor) -> Tensor:
    """log p(next token) of each row of `previous` [B, V]."""
    nxt = next_tokens.to(previous.device).view(-1, 1)
    if nxt.shape[0] != previous.shape[0]:
        raise BadRequest(f"step: score_next has {nxt.shape[0]} rows, the previous step {previous.shape[0]}")
    return (previous.gather(1, nxt).squeeze(1) - torch.logsumexp(previous, dim=-1)).cpu()


def run_step(engine: Engine, req: p.StepRequest) -> p.StepReply:
    cid = req.candidate_id
    for gone in [k for k in _kept if k not in engine.residents]:  # a dropped resident's logits
        del _kept[gone]
    try:
        resident = engine._resident(cid)
        x = validate_step(engine, req.step) if req.step is not None else None
        scored = None
        if req.score_next is not None:
            previous = _kept.pop(cid, None)
            if previous is None:
                raise BadRequest(f"step: nothing to score, {cid} has run no step since the last score")
            scored = _score(previous, req.score_next)
    except BadRequest as e:
        return p.StepReply(status="invalid", error=str(e))
    if req.step is None:
        if req.collect:
            # Survivors are frozen out of later collections: an automatic one between two steps (outside the
            # timed window, inside the evaluator's) then scans only what the steps since allocated.
            gc.collect()
            gc.freeze()
        return p.StepReply(scored=scored)
    proj = _projection(engine.model.spec.vocab_size, req.num_projections, req.seed, str(engine.device))
    timer = _timers.setdefault(id(engine), StepTimer(engine))
    try:
        with collector_off(), engine.armed():
            if req.poison:
                poison_outputs(resident)
            with shared_prefix(resident.ctx.table, req.step.shared):
                logits, tokens, graph, seconds = timer.run(resident, x, req.step.kind)
            feats, argmax = fingerprint(logits, proj, None)
            check_greedy_tokens(resident, tokens, argmax)
            kept = _kept[cid] = logits.float().clone()
            out = kept.cpu().clone() if req.return_logits else None
            if req.poison and not graph:
                logits.fill_(float("nan"))  # a candidate that hands back the same buffer unwritten shows NaN
    except Exception as e:
        return p.StepReply(status="error", error=candidate_failure(e, cid))
    violations = tuple(engine.watch.take()) if engine.watch else ()
    return p.StepReply(
        status="violation" if violations else "ok",
        error="the candidate tried to leave its sandbox: " + "; ".join(violations) if violations else "",
        seconds=seconds, fingerprint=feats.cpu(), tokens=argmax.cpu(), logits=out, scored=scored,
        used_graph=graph, violations=violations)
