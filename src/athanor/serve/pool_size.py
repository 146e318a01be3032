"""The KV pool a server starts with: how many pages each resident candidate gets on this device, found by building
the starting candidate (`build_with_pool`)."""

from __future__ import annotations

import dataclasses
import logging
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from athanor.engine.candidate import Candidate
    from athanor.engine.core import Engine

log = logging.getLogger(__name__)


CPU_CONTEXT = 2048
"""Tokens per slot the CPU's default pool holds (one sequence may still fill the whole context)."""
KV_RESERVE_SHARE = 0.1
"""Of a GPU's memory, what the pool leaves free: a prefill step's activations, the allocator's slack (vLLM's
gpu_memory_utilization of 0.9, the same margin)."""


def build_with_pool(engine: Engine, incumbent: Candidate, what: str) -> bool:
    """Size the KV pool (`engine.config.kv_pages`) and build `incumbent` with it; False, with the reason logged, when
    it did not build or its pool could not hold one whole context. Never another candidate in its place: a server
    runs what it was told to or nothing.

    `--kv-tokens` is taken as given, and the CPU's pool is `CPU_CONTEXT` tokens a slot. On a GPU the pool is what
    memory holds once the weights *and the candidate* are in place, and a candidate's own state besides its pool
    (fused weight copies, graph pools, workspaces) is only known once built: so it is built first with a pool of
    one context, what it holds besides that pool is measured, and it is built again with the pool the rest holds,
    split between the residents a canary keeps (the challenger is assumed to hold as much)."""
    import torch

    from athanor.engine import group
    from athanor.engine import protocol as p
    from athanor.model.spec import kv_cache_bytes
    from athanor.seams import pages_for

    cfg, spec = engine.config, engine.model.spec

    def build(kv_pages: int) -> bool:
        group.configure(engine, dataclasses.replace(cfg, kv_pages=kv_pages))
        reply = group.call(engine, p.SwapRequest(incumbent))
        if reply.status != "ok":
            log.error("%s", reply.error)
            log.error("%s did not build: %s", what, (reply.error.strip().splitlines() or ["no error text"])[-1])
        return reply.status == "ok"

    one_context = pages_for(cfg.max_seq_len, cfg.page_size)
    if cfg.kv_pages > 0:
        pages = cfg.kv_pages
    elif engine.device.type != "cuda":  # a long context need not cost every slot its whole length in memory
        pages = pages_for(max(cfg.max_seq_len, cfg.max_seqs * min(cfg.max_seq_len, CPU_CONTEXT)), cfg.page_size)
    else:
        page_bytes = kv_cache_bytes(spec, 1, cfg.page_size, engine.model.dtype.itemsize)
        free, total = torch.cuda.mem_get_info(engine.device)
        if not build(one_context):
            return False
        held = free - torch.cuda.mem_get_info(engine.device)[0]
        besides_pool = max(0, held - (one_context + 1) * page_bytes)
        group.close(engine)
        room = int(free - KV_RESERVE_SHARE * total) - cfg.max_resident * besides_pool
        pages = max(0, room) // (page_bytes * cfg.max_resident) - 1  # each pool has a scratch page too
        log.info("KV pool: %.2f GiB free after the weights; the candidate holds %.2f GiB besides its pool; %d "
                 "resident(s) of %d pages of %d tokens", free / 2**30, besides_pool / 2**30, cfg.max_resident, pages,
                 cfg.page_size)
    if pages * cfg.page_size < cfg.max_seq_len:
        engine.config = dataclasses.replace(cfg, kv_pages=max(pages, 0))
        log.error("--max-model-len %d: the KV pool holds %d tokens per candidate here, so one sequence could not "
                  "fill its context; lower --max-model-len or give the pool more room (--kv-tokens, --no-canary, a "
                  "larger GPU)", cfg.max_seq_len, max(pages, 0) * cfg.page_size)
        return False
    return build(pages)
