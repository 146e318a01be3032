"""The serving executor on CUDA: chained decode steps (the next queued before the host reads this
one's tokens), also while a long prompt joins in chunks, produce exactly the tokens of unchained steps
(run on a lent GPU)."""

from __future__ import annotations

import pytest
import torch

from athanor.engine import protocol as p
from athanor.engine.candidate import baseline_candidate
from athanor.engine.config import EngineConfig
from athanor.engine.core import Engine
from athanor.model.random_init import random_model
from athanor.model.registry import load_spec
from athanor.serve.config import SchedulerConfig
from athanor.serve.executor import Executor
from athanor.serve.messages import Submit
from athanor.serve.scheduler import Scheduler

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


def _generate(engine: Engine, chain: bool, late: Submit) -> tuple[dict[str, list[int]], int, int]:
    """Serve three requests (different lengths, one sampled, one joining late in chunks of at most 6 tokens) to
    the end; per request its generated tokens, how many steps used a step queued ahead, and how many of those
    also ran prefill chunks."""
    assert engine.active is not None
    cfg = engine.config
    scheduler = Scheduler(SchedulerConfig(max_num_batched_tokens=8), cfg.max_seqs, cfg.max_seq_len, cfg.kv_pages,
                          cfg.page_size)
    scheduler.add_candidate(engine.active)
    executor = Executor(engine, scheduler)
    for request in (Submit("a", (5, 6, 7, 8), 12), Submit("b", (9, 10), 20, temperature=0.8, seed=3)):
        scheduler.submit(request)
    done: dict[str, list[int]] = {}
    used_ahead, with_prefill, steps = 0, 0, 0
    while not scheduler.is_idle or steps < 5:
        if steps == 5:
            scheduler.submit(late)  # joins while a step may be queued ahead: that one is dropped
        plan = scheduler.schedule(lambda seq: engine.active or "")
        ahead = executor._ahead
        used = ahead is not None and executor._continues(ahead, plan)
        assert not executor.run(plan, None, chain=chain)
        used_ahead += used
        with_prefill += used and bool(plan.prefill)
        steps += 1
        for seq in scheduler.finished:
            done[seq.request_id] = seq.tokens[seq.num_prompt:]
        scheduler.finished = []
    executor.settle()
    return done, used_ahead, with_prefill


def test_chained_steps_equal_unchained() -> None:
    # Pages of 4 tokens: the chained steps cross many page boundaries (a step queued ahead writes through the
    # lookahead page the scheduler gave each decoding row).
    config = EngineConfig(model="tiny-dense", device="cuda", dtype="bfloat16", max_seqs=4, max_seq_len=64,
                          page_size=4, kv_pages=64)
    model = random_model(load_spec("tiny-dense"), seed=0, device=torch.device("cuda"), dtype=torch.bfloat16)
    engine = Engine(config, model)
    assert engine.swap(p.SwapRequest(baseline_candidate())).status == "ok"
    late = Submit("c", tuple(range(11, 31)), 9)  # 20 tokens: chunks of 6, 6, 6, 2 beside the two decode rows
    plain, none_ahead, _ = _generate(engine, chain=False, late=late)
    chained, used, with_prefill = _generate(engine, chain=True, late=late)
    assert none_ahead == 0 and used >= 10 and with_prefill >= 2
    assert chained == plain
    assert [len(plain[r]) for r in "abc"] == [12, 20, 9]
