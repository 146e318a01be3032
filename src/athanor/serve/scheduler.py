"""Continuous batching over a paged KV cache: which sequences run in the next step, on which candidate, holding
which pages.

Owned by the serving worker; pure Python (no torch), so it is tested on the CPU without a model.

A `Sequence` is its token list (prompt, then generated tokens) and how many of those tokens its KV pages already
hold (`num_computed`). Each step feeds every running sequence the tokens it has not computed yet: one token for a
sequence that is decoding (a *decode row*), a chunk of at most the remaining token budget for one that is still
prefilling (a *prefill chunk*; a long prompt takes several steps). Decode rows are scheduled first, so a long
prompt never stalls the others for more than one budget's worth of prefill. After a step, a sequence whose
uncomputed tokens all ran gets its next token sampled.

KV memory is paged (the candidate seam, `athanor.model.seam`). Each resident candidate has a pool of `num_pages`
pages of `page_size` tokens (page `num_pages` is the scratch page, never handed out) and a block table
[max_seqs + 1, pages_per_seq]: a running sequence holds a *slot* (a row of that table, `SlotPool`) and the pages
its row lists (`PagePool`); token p of the sequence in slot s lives in page `table[s][p // page_size]`. The
scheduler decides every entry; the executor copies its writes (`PagePool.take_updates`) to the device before
each step. Pages are taken as sequences grow, so the pool is shared by need rather than cut into
`max_seq_len`-sized slices.

Prefix caching is by page: a page whose tokens are all computed is registered under a chained hash of the tokens
up to its end, and a new sequence starts with the cached pages of its longest cached prefix (whole pages only).
Such pages are shared, read-only: a page is written only while a single sequence holds it, and a sequence only
writes positions past its computed tokens, which never fall in a full page. Pages nobody holds stay cached until
a sequence needs a page and none is free (least recently released first).

When a running sequence's next chunk cannot get pages, the most recently admitted sequences on that pool are
preempted (possibly itself): their pages are released (full ones stay cached), and they go back to the front of
the queue to recompute, usually from their own cached pages.

New requests wait in a bounded FIFO queue (`SchedulerConfig.max_queue`; beyond it a submit is refused, which is
the back-pressure the HTTP side turns into 429) until the candidate the router picks has a free slot and the
pages for a first chunk. A sequence stays on the candidate that prefilled it; if that candidate fails, `migrate`
moves it to another, which recomputes its tokens (prompt and output so far).

The executor's side, per step: `plan = schedule(...)`; for every candidate, `page_pools[cid].take_updates()`
written into that candidate's block table; run the plan (a row's slot is `seq.slot`, its twin's `seq.twin_slot`
on `seq.twin_candidate`); `complete(chunk, token)` for each chunk that ran.
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Callable

from athanor.seams import pages_for
from athanor.serve.config import SchedulerConfig
from athanor.serve.kv_pages import PagePool, SlotPool, page_key
from athanor.serve.messages import Submit
from athanor.serve.sequence import Chunk, Router, Sequence, StepPlan, TokenLogprobs

MAX_LOGPROBS = 20
"""Most likely tokens returned per generated token (OpenAI's limit for `top_logprobs`)."""
DECODE_LOOKAHEAD = 1
"""Positions past its own that a decode row also holds a page for. The executor may queue the next decode step
before the host has seen this one's tokens (`Executor.run`, `chain`); that step writes position `end`, which must
then be in a page the sequence holds alone, never a stale table entry (another sequence's, maybe a cached page)."""


class Scheduler:
    def __init__(self, config: SchedulerConfig, max_seqs: int, max_seq_len: int, num_pages: int,
                 page_size: int) -> None:
        """`max_seqs`: slots (block-table rows, the padding row not counted) per candidate; `max_seq_len`: the
        longest sequence; `num_pages`: pages in each candidate's KV pool, scratch not counted (the engine's
        `BuildContext.num_pages`); `page_size`: tokens per page (`BuildContext.page_size`)."""
        assert num_pages > 0 and page_size > 0
        self.config = config
        self.max_seqs = max_seqs
        self.max_seq_len = max_seq_len
        self.num_pages = num_pages
        self.page_size = page_size
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        """In admission order: the last one is the first preempted."""
        self.pools: dict[str, SlotPool] = {}
        self.page_pools: dict[str, PagePool] = {}
        self.finished: list[Sequence] = []
        """Sequences that finished since the worker last drained this list."""
        self.num_preemptions = 0
        """Sequences preempted for lack of pages, since start (a counter for the metrics)."""
        self._probe_ids = itertools.count()

    def pages_for(self, num_tokens: int) -> int:
        """Pages covering positions 0 .. num_tokens - 1."""
        return pages_for(num_tokens, self.page_size)

    # -- candidates -------------------------------------------------------------------------------
    def add_candidate(self, candidate_id: str) -> None:
        self.pools.setdefault(candidate_id, SlotPool(self.max_seqs))
        self.page_pools.setdefault(candidate_id, PagePool(self.num_pages, self.page_size))

    def remove_candidate(self, candidate_id: str) -> None:
        assert not self.sequences_on(candidate_id), "a candidate with sequences on it stays resident"
        self.pools.pop(candidate_id, None)
        self.page_pools.pop(candidate_id, None)

    def sequences_on(self, candidate_id: str) -> list[Sequence]:
        """Running or queued sequences that hold (or are bound to) a slot of `candidate_id`."""
        return [s for s in (*self.running, *self.waiting)
                if s.candidate_id == candidate_id or (s.twin_candidate == candidate_id and s.twin_slot >= 0)]

    # -- requests ---------------------------------------------------------------------------------
    def check(self, request: Submit) -> str:
        """Why the worker cannot run `request` ("" when it can). The front end checks the same first, but for the
        size of the KV pool, which only the worker knows."""
        if not request.prompt:
            return "the prompt is empty"
        if request.max_tokens < 1:
            return f"max_tokens is {request.max_tokens}; it must be at least 1"
        total = len(request.prompt) + request.max_tokens
        if total > self.max_seq_len:
            return (f"the prompt ({len(request.prompt)} tokens) plus max_tokens ({request.max_tokens}) exceeds "
                    f"the context of {self.max_seq_len} tokens")
        if self.pages_for(total) > self.num_pages:
            # Refused here, not preempted forever: alone in an empty pool it still would not fit.
            return (f"the prompt ({len(request.prompt)} tokens) plus max_tokens ({request.max_tokens}) exceeds "
                    f"the KV cache of {self.num_pages * self.page_size} tokens")
        if not 0 < request.top_p <= 1 or request.temperature < 0:
            return "temperature must be >= 0 and top_p in (0, 1]"
        if not -1 <= request.logprobs <= MAX_LOGPROBS:
            return f"logprobs is {request.logprobs}; at most {MAX_LOGPROBS} top tokens are returned"
        return ""

    def submit(self, request: Submit, *, is_probe: bool = False) -> Sequence | None:
        """Queue a request; None when the queue is full (back-pressure)."""
        if not is_probe and len(self.waiting) >= self.config.max_queue:
            return None
        seq = Sequence(request, list(request.prompt), is_probe=is_probe)
        self.waiting.append(seq)
        return seq

    def abort(self, request_id: str) -> Sequence | None:
        """Stop a request wherever it is; returns it (finished, slots and pages freed) or None if unknown."""
        for seq in self.waiting:
            if seq.request_id == request_id:
                self.waiting.remove(seq)
                seq.finish_reason = "abort"
                self.finished.append(seq)
                return seq
        for seq in self.running:
            if seq.request_id == request_id:
                self.finish(seq, "abort")
                return seq
        return None

    def finish(self, seq: Sequence, reason: str, error: str = "") -> None:
        seq.finish_reason = reason
        seq.error = error
        if seq in self.running:
            self.running.remove(seq)
            # An error may have left its KV state half written: no later sequence reuses any of it.
            self._release(seq, keep=not error)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        self.finished.append(seq)

    def drop_twin(self, seq: Sequence) -> None:
        """Stop mirroring `seq` (the canary ended, or the challenger's pool ran short)."""
        self._release_twin(seq)
        seq.twin_candidate = ""

    def migrate(self, seq: Sequence, candidate_id: str) -> None:
        """Move a running sequence to the front of the queue for `candidate_id`: it recomputes its tokens there."""
        self.running.remove(seq)
        self.drop_twin(seq)
        self._release(seq, keep=False)  # its candidate failed: trust none of its pages
        seq.candidate_id = candidate_id
        seq.num_computed = 0
        self.waiting.appendleft(seq)

    def _preempt(self, seq: Sequence) -> None:
        """Take a running sequence's pages back; it waits at the front of the queue to recompute. Its full pages
        stay cached, so it usually resumes where it stopped, less its partial last page."""
        self.running.remove(seq)
        self.drop_twin(seq)
        self._release(seq, keep=True)
        seq.num_computed = 0
        seq.preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(seq)

    def _release(self, seq: Sequence, keep: bool) -> None:
        """Give back the sequence's slot and pages (and its twin's); without `keep`, uncache its pages first."""
        pool = self.page_pools.get(seq.candidate_id)
        if pool is not None:
            if not keep:
                pool.forget(seq.pages)
            pool.release(seq.pages)
        if seq.slot >= 0 and seq.candidate_id in self.pools:
            self.pools[seq.candidate_id].give(seq.slot)
        seq.slot, seq.pages = -1, []
        # The twin's candidate stays named, so the canary can count the finished shadow sequence.
        self._release_twin(seq)

    def _release_twin(self, seq: Sequence) -> None:
        if seq.twin_candidate in self.page_pools:
            self.page_pools[seq.twin_candidate].release(seq.twin_pages)
        if seq.twin_slot >= 0 and seq.twin_candidate in self.pools:
            self.pools[seq.twin_candidate].give(seq.twin_slot)
        seq.twin_slot, seq.twin_pages = -1, []

    # -- pages ----------------------------------------------------------------------------------------
    def _prefix_hit(self, seq: Sequence, pool: PagePool) -> list[int]:
        """The cached pages holding the longest prefix of `seq`'s tokens, whole pages only, leaving at least one
        token to compute (its logits give the next token)."""
        hits: list[int] = []
        for i in range((len(seq.tokens) - 1) // self.page_size):
            page = pool.lookup(self._page_key(seq, i))
            if page is None:
                break
            hits.append(page)
        return hits

    def _page_key(self, seq: Sequence, i: int) -> bytes:
        """Prefix key of `seq`'s page `i` (whose tokens all exist), memoized on the sequence."""
        keys, size = seq.page_keys, self.page_size
        while len(keys) <= i:
            n = len(keys)
            keys.append(page_key(keys[-1] if keys else b"", seq.tokens[n * size:(n + 1) * size]))
        return keys[i]

    def _grow(self, seq: Sequence, end: int, twin: bool) -> bool:
        """Give `seq` (with `twin`, its shadow copy) pages covering positions 0 .. end - 1. When the pool is short,
        the newest sequences holding its pages go first: preempted, or their twin dropped when they hold them as
        one. False when that reached `seq` itself (then preempted, or its twin dropped)."""
        cid = seq.twin_candidate if twin else seq.candidate_id
        pool = self.page_pools[cid]
        held = seq.twin_pages if twin else seq.pages
        need = self.pages_for(end) - len(held)
        while pool.num_available < need:
            victim = next(s for s in reversed(self.running) if s is seq
                          or (s.candidate_id == cid and s.pages) or (s.twin_candidate == cid and s.twin_pages))
            if victim.candidate_id == cid:
                self._preempt(victim)
            else:
                self.drop_twin(victim)
            if victim is seq:
                return False
        if need > 0:
            new = pool.allocate(need)
            pool.map(seq.twin_slot if twin else seq.slot, len(held), new)
            held.extend(new)
        return True

    def _cache_computed(self, seq: Sequence, first: int) -> None:
        """Register `seq`'s full pages from index `first` on, now that their tokens are all computed."""
        pool = self.page_pools.get(seq.candidate_id)
        if pool is not None:
            for i in range(first, seq.num_computed // self.page_size):
                pool.cache(seq.pages[i], self._page_key(seq, i))

    # -- a step -----------------------------------------------------------------------------------
    def schedule(self, route: Router, want_twin: Callable[[Sequence], str] | None = None) -> StepPlan:
        """Pick this step's work under the token budget, give it pages, and admit waiting sequences into what
        is left. Afterwards every chunk's positions (and a decode row's next one) lie in pages its sequence (and
        twin) holds alone, and `take_updates` of each page pool has the table writes for them."""
        budget = self.config.max_num_batched_tokens
        ends: dict[Sequence, int] = {}
        for seq in self.running:
            if seq.is_decoding:
                ends[seq] = seq.num_computed + 1
                budget -= 1
        for seq in self.running:
            if seq not in ends and budget > 0:
                ends[seq] = seq.num_computed + min(len(seq.tokens) - seq.num_computed, budget)
                budget -= ends[seq] - seq.num_computed
        # Pages, oldest first: a sequence short of pages preempts newer ones, which have not taken theirs yet.
        preempted = self.num_preemptions
        for seq in list(self.running):
            end = ends.get(seq)
            if end is None or seq.slot < 0:  # no budget left for it, or preempted for an older one
                continue
            room = self._room(seq, seq.num_computed, end)
            if self._grow(seq, room, twin=False) and seq.twin_slot >= 0:
                self._grow(seq, room, twin=True)  # when False, its twin was dropped: the request itself runs on
        if self.num_preemptions == preempted:  # under pressure, admitting would only preempt again
            self._admit(route, want_twin or (lambda seq: ""), budget, ends)
        plan = StepPlan()
        for seq in self.running:
            if seq in ends:
                part = plan.decode if seq.is_decoding else plan.prefill
                part.setdefault(seq.candidate_id, []).append(Chunk(seq, seq.num_computed, ends[seq]))
        return plan

    def _admit(self, route: Router, want_twin: Callable[[Sequence], str], budget: int,
               ends: dict[Sequence, int]) -> None:
        """Admit waiting sequences (FIFO) while the budget lasts and their candidate has a slot and the pages for
        a first chunk; record each one's chunk end in `ends`. Admission never evicts a running sequence."""
        while self.waiting and budget > 0:
            seq = self.waiting[0]
            cid = seq.candidate_id or route(seq)
            slots, pool = self.pools.get(cid), self.page_pools.get(cid)
            if slots is None or pool is None or slots.num_free == 0:
                break  # FIFO: the head waits for a slot, the others wait behind it
            hits = self._prefix_hit(seq, pool)
            start = len(hits) * self.page_size
            end = start + min(len(seq.tokens) - start, budget)
            if pool.available_besides(hits) < self.pages_for(self._room(seq, start, end)) - len(hits):
                break  # the head waits for pages
            self.waiting.popleft()
            seq.candidate_id = cid  # first: the canary mirrors sequences by the candidate they run on
            twin = want_twin(seq)
            if twin and twin != cid and self._fits_twin(seq, twin, budget):
                # A mirrored sequence computes its whole prompt on both sides, so the two agree token for token.
                hits, start, end = [], 0, min(len(seq.tokens), budget)
                seq.twin_candidate, seq.twin_slot = twin, self.pools[twin].take()
            seq.slot = slots.take()
            pool.acquire(hits)
            pool.map(seq.slot, 0, hits)
            seq.pages = list(hits)
            if not seq.preemptions:  # what the request found cached, not what it left itself
                seq.num_cached = min(start, seq.num_prompt)
            seq.num_computed = start
            self.running.append(seq)
            room = self._room(seq, start, end)
            # The pages were counted above, so neither call preempts anything.
            grown = self._grow(seq, room, twin=False) and (seq.twin_slot < 0 or self._grow(seq, room, twin=True))
            assert grown, "admission took pages it had not counted"
            ends[seq] = end
            budget -= end - start

    @staticmethod
    def _room(seq: Sequence, start: int, end: int) -> int:
        """Positions 0 .. room - 1 need pages for `seq` to feed tokens start:end: a decode row's next one too."""
        decode = 0 < start == len(seq.tokens) - 1
        return end + DECODE_LOOKAHEAD if decode else end

    def _fits_twin(self, seq: Sequence, twin: str, budget: int) -> bool:
        """Whether `seq` can start mirrored on `twin`: a free twin slot, and pages for a first chunk without cache
        hits on both sides."""
        need = self.pages_for(min(len(seq.tokens), budget))
        slots, pool = self.pools.get(twin), self.page_pools.get(twin)
        return (slots is not None and pool is not None and slots.num_free > 0 and pool.num_available >= need
                and self.page_pools[seq.candidate_id].num_available >= need)

    def complete(self, chunk: Chunk, next_token: int | None, logprobs: TokenLogprobs | None = None) -> None:
        """Record that `chunk` ran; cache the pages it filled; append the sampled token (with its `logprobs`, when
        the request asks for them) and finish the sequence on a stop id or a limit."""
        seq = chunk.seq
        if seq.slot < 0:
            return  # finished, preempted or migrated since the plan: nothing of it is kept
        full = seq.num_computed // self.page_size
        seq.num_computed = chunk.end
        self._cache_computed(seq, full)
        if next_token is None or not chunk.samples:
            return
        if next_token in seq.request.stop_ids:
            self.finish(seq, "stop")
            return
        seq.tokens.append(next_token)
        if logprobs is not None:
            seq.logprobs.append(logprobs.logprob)
            seq.top_ids.extend(logprobs.top_ids)
            seq.top_logprobs.extend(logprobs.top_logprobs)
        if seq.num_generated >= seq.request.max_tokens or len(seq.tokens) >= self.max_seq_len:
            self.finish(seq, "length")

    def probe_id(self) -> str:
        return f"probe-{next(self._probe_ids)}"

    @property
    def can_admit(self) -> bool:
        """Whether a waiting sequence may take a slot at the next step (one is waiting, one is free)."""
        return bool(self.waiting) and any(pool.num_free for pool in self.pools.values())

    @property
    def is_idle(self) -> bool:
        return not self.waiting and not self.running
