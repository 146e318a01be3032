"""The scheduler on its own (no model): budgets, chunked prefill, slots, stops, back-pressure, migration."""

from __future__ import annotations

from athanor.serve.config import SchedulerConfig
from athanor.serve.messages import Submit
from athanor.serve.scheduler import Scheduler, SlotPool


def make(budget: int = 8, max_seqs: int = 2, max_queue: int = 4) -> Scheduler:
    s = Scheduler(SchedulerConfig(max_num_batched_tokens=budget, max_queue=max_queue), max_seqs, max_seq_len=64)
    s.add_candidate("A")
    return s


def run_step(s: Scheduler, token: int = 7) -> tuple[int, int]:
    plan = s.schedule(lambda seq: "A")
    for part in (plan.decode, plan.prefill):
        for chunks in part.values():
            for c in chunks:
                s.complete(c, token)
    return plan.num_decode_rows, plan.num_prefill_tokens


def test_long_prompt_is_chunked_and_interleaved_with_decode() -> None:
    s = make(budget=8)
    s.submit(Submit("short", (1, 2, 3), max_tokens=5))
    s.submit(Submit("long", tuple(range(20)), max_tokens=5))
    assert run_step(s) == (0, 8)  # short's 3 tokens and 5 of long's
    assert run_step(s) == (1, 7)  # short decodes; long continues its slot
    assert run_step(s) == (1, 7)
    assert run_step(s) == (2, 0)  # long's last prompt token rides in the decode batch
    long = next(q for q in s.running if q.request_id == "long")
    assert long.num_computed == 20 and long.num_generated == 1


def test_slots_are_reused_and_the_queue_pushes_back() -> None:
    s = make(max_seqs=2, max_queue=2)
    for i in range(2):
        s.submit(Submit(f"r{i}", (1, 2), max_tokens=2))
    s.schedule(lambda seq: "A")  # both admitted: the queue is empty again
    assert s.submit(Submit("r2", (1, 2), max_tokens=2)) is not None
    assert s.submit(Submit("r3", (1,), max_tokens=2)) is not None
    assert s.submit(Submit("r4", (1,), max_tokens=2)) is None  # back-pressure
    assert len(s.running) == 2 and len(s.waiting) == 2
    while not s.is_idle:
        run_step(s)
    assert sorted(q.request_id for q in s.finished) == ["r0", "r1", "r2", "r3"]
    assert all(q.finish_reason == "length" and q.num_generated == 2 for q in s.finished)
    assert s.pools["A"].num_free == 2


def test_stop_id_ends_without_emitting_it_and_abort_frees_the_slot() -> None:
    s = make()
    s.submit(Submit("a", (1, 2), max_tokens=10, stop_ids=(9,)))
    s.submit(Submit("b", (1, 2), max_tokens=10))
    run_step(s, token=5)
    run_step(s, token=9)
    a = next(q for q in s.finished if q.request_id == "a")
    assert a.finish_reason == "stop" and a.tokens == [1, 2, 5]
    b = s.abort("b")
    assert b is not None and b.finish_reason == "abort" and s.is_idle and s.pools["A"].num_free == 2


def test_migrated_sequence_recomputes_its_tokens_elsewhere() -> None:
    s = make(budget=16)
    s.add_candidate("B")
    s.submit(Submit("m", (1, 2, 3), max_tokens=10))
    s.schedule(lambda seq: "B")
    seq = s.running[0]
    for c in s.schedule(lambda q: "B").prefill.get("B", []):
        s.complete(c, 4)
    s.migrate(seq, "A")
    plan = s.schedule(lambda q: "B")
    assert seq.candidate_id == "A" and plan.prefill["A"][0].start == 0 and plan.prefill["A"][0].end == 4


def _finish_alone(s: Scheduler, request_id: str, prompt: tuple[int, ...], max_tokens: int = 2) -> int:
    """Run one request to its end alone; how many of its prompt tokens ran (as prefill chunks or a decode row)."""
    s.submit(Submit(request_id, prompt, max_tokens=max_tokens))
    computed = 0
    while not s.is_idle:
        plan = s.schedule(lambda seq: "A")
        for part in (plan.decode, plan.prefill):
            for chunks in part.values():
                for c in chunks:
                    computed += max(0, min(c.end, len(prompt)) - c.start)
                    s.complete(c, 7)
    return computed


def test_a_conversation_turn_reuses_the_slot_holding_its_history() -> None:
    s = make(budget=64, max_seqs=2)
    turn1 = tuple(range(10, 30))
    assert _finish_alone(s, "turn1", turn1) == 20
    history = s.finished[-1].tokens[:s.finished[-1].num_computed]  # the prompt and the output it fed back
    assert history == [*turn1, 7]
    _finish_alone(s, "other", tuple(range(40, 45)))  # takes the slot that holds nothing
    turn2 = (*turn1, 7, 7, 100, 101)  # the whole history, the last answer, a new message
    assert _finish_alone(s, "turn2", turn2) == len(turn2) - 21
    assert s.finished[-1].num_cached == 21


def test_a_prompt_held_whole_still_computes_its_last_token() -> None:
    s = make(budget=64, max_seqs=1)
    prompt = tuple(range(1, 12))
    _finish_alone(s, "first", prompt, max_tokens=1)  # stops at once: the slot holds the prompt alone
    assert _finish_alone(s, "again", prompt, max_tokens=1) == 1  # the last token's logits are needed


def test_an_unmatched_prompt_takes_the_slot_freed_longest_ago() -> None:
    pool = SlotPool(3)
    taken = [pool.take()[0] for _ in range(3)]
    for slot, held in zip(taken, ([1, 2, 3], [4, 5, 6], [7, 8, 9])):
        pool.give(slot, held)
    assert pool.take([4, 5, 6, 10]) == (taken[1], 3)  # the longest shared prefix wins
    assert pool.take([20, 21]) == (taken[0], 0)  # no match: the slot freed first
    assert pool.take([7, 8]) == (taken[2], 1)  # one token at least is left to compute


def test_a_sequence_that_failed_leaves_nothing_to_reuse() -> None:
    s = make(budget=64, max_seqs=1)
    prompt = tuple(range(1, 9))
    s.submit(Submit("broken", prompt, max_tokens=4))
    run_step(s)
    s.finish(s.running[0], "error", error="the candidate failed")
    assert _finish_alone(s, "retry", prompt) == len(prompt)


def test_the_canary_sees_the_candidate_a_new_sequence_runs_on() -> None:
    s = make(budget=64, max_seqs=2)
    s.add_candidate("B")
    seen: list[str] = []

    def mirror_on_b(seq) -> str:
        seen.append(seq.candidate_id)
        return "B" if seq.candidate_id == "A" else ""

    s.submit(Submit("mirrored", (1, 2, 3), max_tokens=2))
    s.schedule(lambda seq: "A", mirror_on_b)
    seq = s.running[0]
    assert seen == ["A"] and seq.twin_candidate == "B" and seq.twin_slot >= 0 and seq.num_computed == 0
