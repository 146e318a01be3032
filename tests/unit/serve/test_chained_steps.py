"""The serving executor's chained steps (the next decode step queued before the host reads this one's tokens), on
the CPU: a stand-in for a captured runner replays eagerly what a graph replay does, so which rows a queued step
feeds, when it is used, dropped or not queued at all is checked here; tests/gpu runs the same against real graphs."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch import Tensor

from athanor.engine import protocol as p
from athanor.engine.candidate import baseline_candidate
from athanor.engine.config import EngineConfig
from athanor.engine.core import Engine
from athanor.engine.graphs import DecodeRunner, StepInputs
from athanor.model.random_init import random_model
from athanor.model.registry import load_spec
from athanor.serve.config import SchedulerConfig
from athanor.serve.executor import Executor
from athanor.serve.messages import Submit
from athanor.serve.scheduler import Scheduler


class EagerChain:
    """Acts as a runner with captured graphs: `step` runs eagerly and remembers its rows; `step_again` feeds each
    of them the token it produced, one position on (what `DecodeRunner.step_again` does with its static inputs)."""

    captured = True

    def __init__(self, inner: DecodeRunner) -> None:
        self.inner = inner
        self.last: tuple[StepInputs, bool, Tensor] | None = None
        self.replays = 0

    def step(self, x: StepInputs, greedy: bool = False) -> tuple[Tensor, Tensor, bool]:
        tokens, logits = self.inner.eager(x, greedy)
        self.last = (x, greedy, tokens)
        return tokens, logits, True

    def step_again(self) -> tuple[Tensor, Tensor] | None:
        assert self.last is not None
        x, greedy, tokens = self.last
        x = dataclasses.replace(x, tokens=tokens.clone(), positions=x.positions + 1, seq_lens=x.seq_lens + 1)
        out, logits = self.inner.eager(x, greedy)
        self.last = (x, greedy, out)
        self.replays += 1
        return out, logits

    def release(self) -> None:
        self.inner.release()


@pytest.fixture(scope="module")
def engine() -> Engine:
    config = EngineConfig(model="tiny-dense", device="cpu", max_seqs=4, max_seq_len=64, page_size=4, kv_pages=64)
    engine = Engine(config, random_model(load_spec("tiny-dense"), seed=0, device=torch.device("cpu"),
                                         dtype=torch.float32))
    assert engine.swap(p.SwapRequest(baseline_candidate())).status == "ok"
    return engine


def _serve(engine: Engine, chain: bool, stop_id: int | None = None) -> tuple[dict[str, list[int]], int, int, int]:
    """Serve three requests (different lengths, one sampled, one of 20 tokens joining late in chunks of at most 6
    beside the decode rows) to the end: per request its tokens, and how many steps used a step queued ahead, how
    many of those also ran prefill chunks, and how many queued steps were dropped."""
    assert engine.active is not None
    resident = engine.residents[engine.active]
    runner, resident.runner = resident.runner, EagerChain(resident.runner)  # type: ignore[assignment]
    try:
        cfg = engine.config
        scheduler = Scheduler(SchedulerConfig(max_num_batched_tokens=8), cfg.max_seqs, cfg.max_seq_len, cfg.kv_pages,
                              cfg.page_size)
        scheduler.add_candidate(engine.active)
        executor = Executor(engine, scheduler)
        stops = () if stop_id is None else (stop_id,)
        scheduler.submit(Submit("a", (5, 6, 7, 8), 12, stop_ids=stops))
        scheduler.submit(Submit("b", (9, 10), 20, temperature=0.8, seed=3))
        done: dict[str, list[int]] = {}
        used = with_prefill = dropped = steps = 0
        while not scheduler.is_idle or steps < 5:
            if steps == 5:
                scheduler.submit(Submit("c", tuple(range(11, 31)), 9))
            plan = scheduler.schedule(lambda seq: engine.active or "")
            ahead = executor._ahead
            fits = ahead is not None and executor._continues(ahead, plan)
            assert not executor.run(plan, None, chain=chain)
            used += fits
            with_prefill += fits and bool(plan.prefill)
            dropped += ahead is not None and not fits
            steps += 1
            for seq in scheduler.finished:
                done[seq.request_id] = seq.tokens[seq.num_prompt:]
            scheduler.finished = []
        executor.settle()
        return done, used, with_prefill, dropped
    finally:
        resident.runner = runner


def test_chained_steps_give_the_tokens_of_unchained_ones_while_a_prompt_joins(engine: Engine) -> None:
    plain, none_used, _, _ = _serve(engine, chain=False)
    chained, used, with_prefill, dropped = _serve(engine, chain=True)
    assert none_used == 0 and used >= 10
    assert with_prefill >= 3  # the joining prompt's chunks that sample no token ran beside queued decode steps
    assert dropped == 0  # none queued in vain: not past a row's limit, nor when a joining prompt samples
    assert chained == plain
    assert [len(plain[r]) for r in "abc"] == [12, 20, 9]


def test_a_row_that_stops_early_drops_the_step_queued_after_it(engine: Engine) -> None:
    plain, _, _, _ = _serve(engine, chain=False)
    stop = plain["a"][3]  # "a" stops on its fourth token: unforeseen, so a step was queued past it
    plain_stopped, _, _, _ = _serve(engine, chain=False, stop_id=stop)
    chained, _, _, dropped = _serve(engine, chain=True, stop_id=stop)
    assert dropped >= 1 and chained == plain_stopped
    assert len(chained["a"]) < 12
