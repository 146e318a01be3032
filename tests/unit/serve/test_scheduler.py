"""The scheduler on its own (no model): budgets, chunked prefill, slots, pages, prefix caching, preemption,
stops, back-pressure, migration."""

from __future__ import annotations

import random
from collections.abc import Callable

from athanor.serve.config import SchedulerConfig
from athanor.serve.kv_pages import PagePool, page_key
from athanor.serve.messages import Submit
from athanor.serve.scheduler import DECODE_LOOKAHEAD, Scheduler
from athanor.serve.sequence import Chunk, Sequence, StepPlan


def make(budget: int = 8, max_seqs: int = 2, max_queue: int = 4, num_pages: int = 64, page_size: int = 4,
         candidates: tuple[str, ...] = ("A",)) -> Scheduler:
    s = Scheduler(SchedulerConfig(max_num_batched_tokens=budget, max_queue=max_queue), max_seqs, max_seq_len=64,
                  num_pages=num_pages, page_size=page_size)
    for cid in candidates:
        s.add_candidate(cid)
    return s


class Device:
    """What the executor keeps of the scheduler's pages: each candidate's block table, written only through
    `take_updates`, and checked against the pages the plan's chunks use."""

    def __init__(self, s: Scheduler) -> None:
        self.s = s
        self.tables: dict[str, dict[tuple[int, int], int]] = {}

    def sync(self, plan: StepPlan) -> None:
        for cid, pool in self.s.page_pools.items():
            table = self.tables.setdefault(cid, {})
            for slot, i, page in pool.take_updates():
                table[slot, i] = page
        for part in (plan.decode, plan.prefill):
            for chunks in part.values():
                for c in chunks:
                    self.check(c)

    def check(self, c: Chunk) -> None:
        """Every position the chunk writes (a decode row's next one too) is in a page that its sequence holds
        alone and that is not cached, named by the device's table; the same for its twin."""
        seq, s = c.seq, self.s
        last = c.end + (DECODE_LOOKAHEAD if seq.is_decoding else 0)
        for cid, slot, pages in ((seq.candidate_id, seq.slot, seq.pages),
                                 (seq.twin_candidate, seq.twin_slot, seq.twin_pages)):
            if slot < 0:
                continue
            pool = s.page_pools[cid]
            assert len(pages) == s.pages_for(last), "pages cover the chunk, no more"
            for i, page in enumerate(pages):
                assert self.tables[cid][slot, i] == page, "the table names the sequence's pages"
                if (i + 1) * s.page_size > c.start:  # a page the chunk writes
                    assert pool.refcount(page) == 1 and not pool.is_cached(page)


def run_step(s: Scheduler, token: int | Callable[[Sequence], int] = 7, route: str = "A",
             device: Device | None = None, want_twin: Callable[[Sequence], str] | None = None) -> tuple[int, int]:
    plan = s.schedule(lambda seq: route, want_twin)
    if device is not None:
        device.sync(plan)
    for part in (plan.decode, plan.prefill):
        for chunks in part.values():
            for c in chunks:
                s.complete(c, token if isinstance(token, int) else token(c.seq))
    return plan.num_decode_rows, plan.num_prefill_tokens


def test_long_prompt_is_chunked_and_interleaved_with_decode() -> None:
    s = make(budget=8)
    s.submit(Submit("short", (1, 2, 3), max_tokens=5))
    s.submit(Submit("long", tuple(range(20)), max_tokens=5))
    assert run_step(s) == (0, 8)  # short's 3 tokens and 5 of long's
    assert run_step(s) == (1, 7)  # short decodes; long continues
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
    assert s.pools["A"].num_free == 2 and s.page_pools["A"].num_available == 64


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
    assert b.pages == [] and s.page_pools["A"].num_available == 64


def test_migrated_sequence_recomputes_its_tokens_elsewhere() -> None:
    s = make(budget=16)
    s.add_candidate("B")
    s.submit(Submit("m", (1, 2, 3), max_tokens=10))
    s.schedule(lambda seq: "B")
    seq = s.running[0]
    for c in s.schedule(lambda q: "B").prefill.get("B", []):
        s.complete(c, 4)
    s.migrate(seq, "A")
    assert s.page_pools["B"].num_available == 64  # its pages on B are back
    plan = s.schedule(lambda q: "B")
    assert seq.candidate_id == "A" and plan.prefill["A"][0].start == 0 and plan.prefill["A"][0].end == 4


def _finish_alone(s: Scheduler, request_id: str, prompt: tuple[int, ...], max_tokens: int = 2,
                  device: Device | None = None) -> int:
    """Run one request to its end alone; how many of its prompt tokens ran (as prefill chunks or a decode row)."""
    s.submit(Submit(request_id, prompt, max_tokens=max_tokens))
    computed = 0
    while not s.is_idle:
        plan = s.schedule(lambda seq: "A")
        if device is not None:
            device.sync(plan)
        for part in (plan.decode, plan.prefill):
            for chunks in part.values():
                for c in chunks:
                    computed += max(0, min(c.end, len(prompt)) - c.start)
                    s.complete(c, 7)
    return computed


def test_a_conversation_turn_reuses_the_pages_of_its_history_rounded_down_to_a_page() -> None:
    s = make(budget=64, page_size=8)
    turn1 = tuple(range(10, 30))
    assert _finish_alone(s, "turn1", turn1) == 20
    history = s.finished[-1].tokens[:s.finished[-1].num_computed]  # the prompt and the output it fed back
    assert history == [*turn1, 7]
    _finish_alone(s, "other", tuple(range(40, 45)))
    turn2 = (*turn1, 7, 7, 100, 101)  # the whole history, the last answer, a new message
    # 21 tokens are shared, but the third page (tokens 16..23) was partial: only two pages are reused, and
    # tokens 16..20 are computed again into a page of turn2's own.
    assert _finish_alone(s, "turn2", turn2) == len(turn2) - 16
    assert s.finished[-1].num_cached == 16


def test_a_prompt_held_whole_still_computes_its_last_token() -> None:
    s = make(budget=64, page_size=4)
    prompt = tuple(range(1, 10))  # two full pages and one token
    _finish_alone(s, "first", prompt, max_tokens=1)  # stops at once: the cache holds the prompt's full pages
    assert _finish_alone(s, "again", prompt, max_tokens=1) == 1  # the last token's logits are needed
    assert s.finished[-1].num_cached == 8
    aligned = tuple(range(1, 13))  # three full pages: the last is recomputed, whole, to leave a token
    _finish_alone(s, "aligned", aligned, max_tokens=1)
    assert _finish_alone(s, "aligned again", aligned, max_tokens=1) == 4


def test_a_sequence_that_failed_leaves_nothing_to_reuse() -> None:
    s = make(budget=64, max_seqs=1)
    prompt = tuple(range(1, 9))
    s.submit(Submit("broken", prompt, max_tokens=4))
    run_step(s)
    s.finish(s.running[0], "error", error="the candidate failed")
    assert _finish_alone(s, "retry", prompt) == len(prompt)


def test_cached_pages_are_evicted_least_recently_released_first() -> None:
    pool = PagePool(num_pages=4, page_size=2)
    keys = {}
    for name, tokens in (("x", [1, 2, 3, 4]), ("y", [5, 6, 7, 8])):
        pages = pool.allocate(2)
        k0 = page_key(b"", tokens[:2])
        keys[name] = (k0, page_key(k0, tokens[2:]))
        for page, key in zip(pages, keys[name]):
            pool.cache(page, key)
        pool.release(pages)
    x0, x1 = (pool.lookup(k) for k in keys["x"])
    y0, y1 = (pool.lookup(k) for k in keys["y"])
    assert pool.num_available == 4 and None not in (x0, x1, y0, y1)
    assert pool.allocate(1) == [x1]  # x was released first, and a prefix's last page goes before its first
    assert pool.lookup(keys["x"][1]) is None and pool.lookup(keys["x"][0]) == x0
    assert y0 is not None
    pool.acquire([y0])  # a hit on y's first page: held, so not evictable, and recent once released
    pool.release([y0])
    assert pool.allocate(2) == [x0, y1]
    assert pool.lookup(keys["y"][0]) == y0 and pool.refcount(y0) == 0


def test_the_scheduler_evicts_the_prefix_used_longest_ago() -> None:
    s = make(budget=64, max_seqs=1, num_pages=6, page_size=4)  # 24 tokens: room for two 8-token prefixes
    a, b = (tuple(range(base, base + 8)) for base in (100, 200))
    for name, prompt in (("a", a), ("b", b)):
        _finish_alone(s, name, (*prompt, 1), max_tokens=1)  # each leaves its two full pages cached
    _finish_alone(s, "a again", (*a, 2), max_tokens=1)  # a hit: a is now the most recently used
    _finish_alone(s, "c", tuple(range(300, 313)), max_tokens=1)  # 4 pages: the 2 free ones and b's 2
    assert _finish_alone(s, "a third", (*a, 4), max_tokens=1) == 1
    assert _finish_alone(s, "b again", (*b, 5), max_tokens=1) == 9


def test_shared_prefix_pages_are_shared_and_never_written() -> None:
    s = make(budget=16, max_seqs=3, page_size=4)
    device = Device(s)
    system = tuple(range(50, 60))  # two full pages and two tokens
    _finish_alone(s, "warm", (*system, 1), device=device)
    for i in range(3):
        s.submit(Submit(f"q{i}", (*system, 10 + i, 20 + i), max_tokens=4))
    run_step(s, device=device)
    assert [q.num_cached for q in s.running] == [8, 8, 8]
    shared = s.running[0].pages[:2]
    assert all(q.pages[:2] == shared for q in s.running)
    assert all(s.page_pools["A"].refcount(p) == 3 for p in shared)
    while not s.is_idle:
        run_step(s, device=device)
    assert all(q.finish_reason == "length" for q in s.finished)
    assert s.page_pools["A"].num_available == 64


def test_preemption_lets_every_sequence_finish_in_a_small_pool() -> None:
    # 8 pages of 4 tokens; each sequence grows to 16 tokens (4 pages), and four run at once.
    s = make(budget=16, max_seqs=4, num_pages=8, page_size=4)
    device = Device(s)
    prompts = {f"r{i}": tuple(range(10 * i, 10 * i + 6)) for i in range(4)}
    for rid, prompt in prompts.items():
        assert s.check(Submit(rid, prompt, max_tokens=10)) == ""
        s.submit(Submit(rid, prompt, max_tokens=10))

    def next_token(seq: Sequence) -> int:
        return 1000 + len(seq.tokens)  # what the model would say does not depend on how often it recomputed

    resumed_from_cache = False
    for _ in range(200):
        if s.is_idle:
            break
        plan = s.schedule(lambda seq: "A")
        device.sync(plan)
        resumed_from_cache |= any(c.seq.preemptions and c.start > 0 and c.start < len(c.seq.tokens) - 1
                                  for c in plan.prefill.get("A", []) if c.seq.num_generated)
        for part in (plan.decode, plan.prefill):
            for chunks in part.values():
                for c in chunks:
                    s.complete(c, next_token(c.seq))
    assert s.is_idle and s.num_preemptions > 0
    assert sorted(q.request_id for q in s.finished) == sorted(prompts)
    for q in s.finished:
        assert q.finish_reason == "length" and q.tokens == [*prompts[q.request_id], *range(1006, 1016)]
    assert resumed_from_cache  # a preempted sequence found its own full pages again
    assert s.page_pools["A"].num_available == 8 and s.pools["A"].num_free == 4


def test_the_most_recently_admitted_sequence_is_preempted() -> None:
    s = make(budget=16, max_seqs=2, num_pages=4, page_size=4)
    s.submit(Submit("old", tuple(range(1, 8)), max_tokens=8))  # 7 tokens: 2 pages
    s.submit(Submit("new", tuple(range(11, 18)), max_tokens=8))
    run_step(s)  # both prefilled: all four pages held
    old, new = s.running
    assert s.page_pools["A"].num_available == 0
    run_step(s)  # old's first decode row fits its pages; its lookahead (position 8) needs a third page
    assert s.num_preemptions == 1 and new.preemptions == 1 and list(s.waiting) == [new]
    assert s.running == [old] and len(old.pages) == 3 and new.slot == -1 and new.pages == []
    assert new.num_computed == 0 and new.num_generated == 1  # it keeps its output, and recomputes its KV


def test_the_newest_sequence_preempts_itself_rather_than_an_older_one() -> None:
    s = make(budget=16, max_seqs=2, num_pages=4, page_size=4)
    device = Device(s)
    s.submit(Submit("old", tuple(range(1, 6)), max_tokens=8))  # 5 tokens: its decode rows fit 2 pages for a while
    s.submit(Submit("new", tuple(range(11, 18)), max_tokens=8))  # 7 tokens: its first decode row needs a third
    run_step(s, device=device)
    old, new = s.running
    run_step(s, device=device)
    assert s.num_preemptions == 1 and new.preemptions == 1 and old.preemptions == 0
    assert s.running == [old] and old.num_generated == 2
    for _ in range(100):
        if s.is_idle:
            break
        run_step(s, device=device)
    assert s.is_idle and old.preemptions == 0 and sorted(q.request_id for q in s.finished) == ["new", "old"]
    assert all(q.finish_reason == "length" and q.num_generated == 8 for q in s.finished)


def test_check_refuses_a_request_larger_than_the_pool() -> None:
    s = make(num_pages=4, page_size=4)  # 16 tokens of KV, though the context is 64
    why = s.check(Submit("big", tuple(range(10)), max_tokens=8))
    assert "16 tokens" in why and "\n" not in why
    assert s.check(Submit("fits", tuple(range(10)), max_tokens=6)) == ""


def test_the_canary_sees_the_candidate_a_new_sequence_runs_on() -> None:
    s = make(budget=64, max_seqs=2)
    s.add_candidate("B")
    seen: list[str] = []

    def mirror_on_b(seq: Sequence) -> str:
        seen.append(seq.candidate_id)
        return "B" if seq.candidate_id == "A" else ""

    s.submit(Submit("mirrored", (1, 2, 3), max_tokens=2))
    s.schedule(lambda seq: "A", mirror_on_b)
    seq = s.running[0]
    assert seen == ["A"] and seq.twin_candidate == "B" and seq.twin_slot >= 0 and seq.num_computed == 0
    assert len(seq.twin_pages) == 1


def test_twins_get_no_cache_hits_and_their_pages_go_back() -> None:
    s = make(budget=64, max_seqs=2, page_size=4, candidates=("A", "B"))
    device = Device(s)
    prompt = tuple(range(1, 14))
    _finish_alone(s, "warm", prompt, device=device)  # A caches three pages of the prompt
    s.submit(Submit("mirrored", prompt, max_tokens=3))
    plan = s.schedule(lambda seq: "A", lambda seq: "B")
    device.sync(plan)
    seq = s.running[0]
    assert seq.twin_candidate == "B" and seq.num_cached == 0 and plan.prefill["A"][0].start == 0
    assert not set(seq.pages) & set(s.finished[0].pages)  # nothing shared with the cached prompt
    for c in plan.prefill["A"]:
        s.complete(c, 7)
    while not s.is_idle:
        run_step(s, device=device)
    assert seq.twin_candidate == "B" and seq.twin_slot == -1  # still named, for the canary's count
    assert s.page_pools["B"].num_available == 64 and s.pools["B"].num_free == 2


def test_a_twin_short_of_pages_is_dropped_and_the_request_runs_on() -> None:
    s = make(budget=64, max_seqs=2, num_pages=4, page_size=4, candidates=("A", "B"))
    s.submit(Submit("mirrored", tuple(range(1, 8)), max_tokens=8))
    run_step(s, want_twin=lambda seq: "B")
    seq = s.running[0]
    assert seq.twin_slot >= 0
    s.page_pools["B"].allocate(2)  # something else (a live sequence of B) takes the rest of B's pool
    run_step(s, want_twin=lambda seq: "B")  # the decode row's lookahead needs a third page on both sides
    assert seq.twin_candidate == "" and seq.twin_slot == -1 and seq in s.running and s.num_preemptions == 0
    assert seq.num_generated == 2


def _check_holds(s: Scheduler) -> None:
    """Each page's refcount is the number of running sequences (and twins) holding it; the rest is available."""
    for cid, pool in s.page_pools.items():
        holds = [0] * pool.num_pages
        for q in s.running:
            for held_on, pages in ((q.candidate_id, q.pages), (q.twin_candidate if q.twin_slot >= 0 else "", q.twin_pages)):
                if held_on == cid:
                    for page in pages:
                        holds[page] += 1
        assert holds == [pool.refcount(p) for p in range(pool.num_pages)]
        assert pool.num_available == holds.count(0)
    assert all(not q.pages and q.slot < 0 and q.twin_slot < 0 for q in s.waiting)


def _random_traffic(seed: int) -> None:
    """Twelve requests over two candidates with shared prefixes, stops, aborts, migrations, twins and dropped
    twins, under a random budget and pool; every step keeps the books, and everything finishes."""
    rng = random.Random(seed)
    s = make(budget=rng.choice([4, 8, 32]), max_seqs=rng.choice([2, 3, 5]), max_queue=100,
             num_pages=rng.choice([6, 10, 40]), page_size=rng.choice([1, 2, 4, 8]), candidates=("A", "B"))
    device = Device(s)
    stems = [tuple(rng.randrange(50) for _ in range(rng.randrange(1, 12))) for _ in range(3)]
    submitted = []
    for i in range(12):
        prompt = rng.choice(stems) + tuple(rng.randrange(50) for _ in range(rng.randrange(1, 6)))
        request = Submit(f"r{i}", prompt, max_tokens=rng.randrange(1, 10), stop_ids=(3,))
        if s.check(request) == "":
            assert s.submit(request) is not None
            submitted.append(request.request_id)
    for _ in range(1000):
        if s.is_idle:
            break
        if rng.random() < 0.03 and s.running:
            s.abort(rng.choice(s.running).request_id)
        if rng.random() < 0.03 and s.running:
            q = rng.choice(s.running)
            s.migrate(q, "B" if q.candidate_id == "A" else "A")
        if rng.random() < 0.03 and s.running:
            s.drop_twin(rng.choice(s.running))
        run_step(s, token=lambda q: rng.randrange(50), route=rng.choice("AB"), device=device,
                 want_twin=lambda q: "B" if q.candidate_id == "A" and rng.random() < 0.3 else "")
        _check_holds(s)
    assert s.is_idle, f"seed {seed}: not idle after 1000 steps"
    assert sorted(q.request_id for q in s.finished) == sorted(submitted)
    for cid in "AB":
        assert s.page_pools[cid].num_available == s.num_pages and s.pools[cid].num_free == s.max_seqs


def test_random_traffic_keeps_the_books_and_finishes() -> None:
    for seed in range(20):
        _random_traffic(seed)


def test_every_message_survives_the_wire() -> None:
    from athanor.serve import messages as m

    outputs = (m.TokenOutput("a", (1, 2), None, "", "c1", (-0.5, -1.25), (1, 7, 2, 9), (-0.5, -0.9, -1.25, -2.0)),
               m.TokenOutput("b", (), "error", "boom", "c1"))
    state = m.DeploymentState(3, "c2", "c1", "shadow", "", {"kl": 0.001}, 1.0, 2.0)
    for message in (m.Submit("a", (1, 2, 3), 8, 0.7, 0.9, 5, (2,), 3), m.Abort("a"), m.StatusQuery(), m.Shutdown(),
                    m.Deploy(3, "src", "h" * 64, "p", "me", "d", ((1, 2), (3,))),
                    m.StepReport(outputs, 2, 300, 1, 2, 0.01, 1), m.StepReport((), 0, 16, 0, 1, 0.02),
                    m.Rejected("a", "no", "queue_full"), state,
                    m.Status("c1", ("c1", "c2"), 0, 2, 7, state, 4096), m.Status("c1", ("c1",), 0, 0)):
        assert m.decode(m.encode(message)) == message
