"""An engine worker as a layout group (`athanor.engine.group`): a sandboxed rank 0 starts rank 1 in its sandbox, each
holds its TP shard of tiny-qwen, and every RPC runs on both in lockstep. Its outputs are one device's; a swap that
fails on one rank is undone on every rank, with the failing rank named, and the group runs on in step."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import pytest
import torch
from engine_candidates import CONFIG, patched

from athanor.engine import protocol as p
from athanor.engine.candidate import baseline_candidate
from athanor.engine.supervisor import Supervisor, Timeouts

TP2 = dataclasses.replace(CONFIG, model="tiny-qwen", layout={"tp": 2})
PROMPTS = ((5, 6, 7, 8, 9, 10), (11, 12, 13))


def _generate(engine: Supervisor) -> tuple[tuple[int, ...], ...]:
    reply = engine.call(p.GenerateRequest(PROMPTS, 10))
    assert reply.status == "ok", reply.error
    return tuple(reply.tokens)


def _logits(engine: Supervisor) -> torch.Tensor:
    one = torch.tensor([3])
    reply = engine.call(p.RunRequest("prefill", torch.tensor([5, 6, 7, 8]), torch.arange(4), torch.tensor([0]),
                                     torch.tensor([0]), torch.zeros(1), torch.ones(1), one,
                                     cu_seqlens=torch.tensor([0, 4]), return_logits=True))
    assert reply.status == "ok", reply.error
    return reply.logits


@pytest.fixture(scope="module")
def group() -> Iterator[Supervisor]:
    sup = Supervisor(TP2, Timeouts(start_s=120, swap_s=60, run_s=30, other_s=30))
    sup.start()
    yield sup
    sup.close()


def test_two_ranks_give_one_devices_outputs_and_a_swap_failing_on_one_is_undone_on_all(group: Supervisor) -> None:
    one = Supervisor(dataclasses.replace(TP2, layout={}), Timeouts(start_s=120, swap_s=60, run_s=30, other_s=30))
    one.start()
    try:
        want_tokens, want_logits = _generate(one), _logits(one)
    finally:
        one.close()
    assert _generate(group) == want_tokens
    torch.testing.assert_close(_logits(group), want_logits, rtol=1e-4, atol=1e-4 * want_logits.abs().max().item())
    assert any("rank 0 of 2" in line for line in group.call(p.HealthRequest()).sandbox)

    incumbent = group.call(p.StatsRequest()).active_candidate
    fails_on_rank_one = patched("_reference_build = build\n"
                                "def build(model, ctx):\n"
                                "    if ctx.rank == 1:\n"
                                "        raise RuntimeError('planted: rank one cannot build this')\n"
                                "    return _reference_build(model, ctx)\n")
    reply = group.swap(fails_on_rank_one)
    assert reply.status == "error" and "rank 1 of 2 failed" in reply.error, reply.error
    assert "planted: rank one cannot build this" in reply.error
    stats = group.call(p.StatsRequest())
    assert stats.active_candidate == incumbent and stats.resident == (incumbent,)
    assert _generate(group) == want_tokens  # rank 1 runs the incumbent too: the collectives still meet

    assert group.swap(baseline_candidate()).status == "ok"  # a candidate every rank builds swaps in as alone
    assert _generate(group) == want_tokens
