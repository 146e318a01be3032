"""Continuous batching: which sequences run in the next step, on which candidate, in which slot.

Owned by the serving worker; pure Python (no torch), so it is tested on the CPU without a model.

A `Sequence` is its token list (prompt, then generated tokens) and how many of those tokens its
slot's KV state already holds (`num_computed`). Each step feeds every running sequence the tokens
it has not computed yet: one token for a sequence that is decoding (a *decode row*), a chunk of at
most the remaining token budget for one that is still prefilling (a *prefill chunk*; a long prompt
takes several steps, continuing its slot). Decode rows are scheduled first, so a long prompt never
stalls the others for more than one budget's worth of prefill. After a step, a sequence whose
uncomputed tokens all ran gets its next token sampled.

New requests wait in a bounded FIFO queue (`SchedulerConfig.max_queue`; beyond it a submit is
refused, which is the back-pressure the HTTP side turns into 429) until the candidate the router
picks has a free slot. A sequence stays on the candidate that prefilled it; if that candidate
fails, `migrate` moves it to another, which recomputes its tokens (prompt and output so far).
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from athanor.serve.config import SchedulerConfig
from athanor.serve.messages import Submit


@dataclass(eq=False)
class Sequence:
    """One request's state in the worker."""

    request: Submit
    tokens: list[int]
    """Prompt, then generated tokens."""
    candidate_id: str = ""
    slot: int = -1
    num_computed: int = 0
    """Tokens held in the slot's KV state."""
    num_cached: int = 0
    """Of those, the prompt tokens its slot already held when it was admitted (no prefill ran for them)."""
    num_emitted: int = 0
    """Generated tokens already reported to the front end."""
    finish_reason: str | None = None
    error: str = ""
    is_probe: bool = False
    """A canary probe of the worker's own: nothing is reported for it."""
    twin_slot: int = -1
    """Slot of the shadow copy on the challenger (teacher-forced with this sequence's tokens), or -1."""
    twin_candidate: str = ""

    @property
    def request_id(self) -> str:
        return self.request.request_id

    @property
    def num_prompt(self) -> int:
        return len(self.request.prompt)

    @property
    def num_generated(self) -> int:
        return len(self.tokens) - self.num_prompt

    @property
    def is_decoding(self) -> bool:
        """Only the last sampled token is left to feed (and the prompt was computed before)."""
        return self.num_computed > 0 and self.num_computed == len(self.tokens) - 1


@dataclass(frozen=True)
class Chunk:
    """Tokens `start:end` of a sequence's token list, fed in one step (a decode row when end - start == 1)."""

    seq: Sequence
    start: int
    end: int

    @property
    def samples(self) -> bool:
        """The chunk reaches the end of the sequence's tokens, so a next token is sampled after it."""
        return self.end == len(self.seq.tokens)


@dataclass
class StepPlan:
    """One step: per candidate, its decode rows and prefill chunks."""

    decode: dict[str, list[Chunk]] = field(default_factory=dict)
    prefill: dict[str, list[Chunk]] = field(default_factory=dict)

    @property
    def num_decode_rows(self) -> int:
        return sum(len(v) for v in self.decode.values())

    @property
    def num_prefill_tokens(self) -> int:
        return sum(c.end - c.start for v in self.prefill.values() for c in v)

    def __bool__(self) -> bool:
        return bool(self.num_decode_rows or self.num_prefill_tokens)


class SlotPool:
    """Free KV slots of one resident candidate (slot `max_seqs` is the engine's padding slot: never handed out),
    each remembering the tokens its KV state still holds from the sequence that last used it.

    Prefix reuse: `take(tokens)` hands out the free slot whose held tokens share the longest prefix with `tokens`,
    and how many of them are shared; that many need no prefill. Conversations resend their history each turn, so
    the slot of a conversation's last turn usually holds most of the next turn's prompt. A slot whose content
    matches nothing is taken least recently freed first (LRU), so the most recent histories stay longest.
    """

    def __init__(self, max_seqs: int) -> None:
        self._free: dict[int, list[int]] = {slot: [] for slot in range(max_seqs)}
        """Free slot -> the tokens its KV state holds, oldest freed first (dicts keep insertion order)."""

    def take(self, tokens: list[int] | None = None) -> tuple[int, int]:
        """(a free slot, the number of leading tokens of `tokens` it already holds); at least one token of
        `tokens` is left to compute, since the next token is sampled from the last one's logits."""
        best, shared = next(iter(self._free)), 0
        if tokens:
            for slot, held in self._free.items():
                n = common_prefix(held, tokens, len(tokens) - 1)
                if n > shared:
                    best, shared = slot, n
        del self._free[best]
        return best, shared

    def give(self, slot: int, held: list[int] | None = None) -> None:
        """Free `slot`, its KV state holding `held` (nothing reusable when None)."""
        self._free.pop(slot, None)
        self._free[slot] = held or []

    @property
    def num_free(self) -> int:
        return len(self._free)


def common_prefix(a: list[int], b: list[int], limit: int) -> int:
    """Length of the longest common prefix of a and b, at most `limit` (binary search over C-speed slice compares)."""
    lo, hi = 0, min(len(a), len(b), limit)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


Router = Callable[[Sequence], str]
"""Picks the candidate a new sequence is prefilled on."""


class Scheduler:
    def __init__(self, config: SchedulerConfig, max_seqs: int, max_seq_len: int) -> None:
        self.config = config
        self.max_seqs = max_seqs
        self.max_seq_len = max_seq_len
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.pools: dict[str, SlotPool] = {}
        self.finished: list[Sequence] = []
        """Sequences that finished since the worker last drained this list."""
        self._probe_ids = itertools.count()

    # -- candidates -------------------------------------------------------------------------------
    def add_candidate(self, candidate_id: str) -> None:
        self.pools.setdefault(candidate_id, SlotPool(self.max_seqs))

    def remove_candidate(self, candidate_id: str) -> None:
        assert not self.sequences_on(candidate_id), "a candidate with sequences on it stays resident"
        self.pools.pop(candidate_id, None)

    def sequences_on(self, candidate_id: str) -> list[Sequence]:
        """Running or queued sequences that hold (or are bound to) a slot of `candidate_id`."""
        return [s for s in (*self.running, *self.waiting)
                if s.candidate_id == candidate_id or (s.twin_candidate == candidate_id and s.twin_slot >= 0)]

    # -- requests ---------------------------------------------------------------------------------
    def check(self, request: Submit) -> str:
        """Why the worker cannot run `request` ("" when it can); the front end checks the same first."""
        if not request.prompt:
            return "the prompt is empty"
        if request.max_tokens < 1:
            return f"max_tokens is {request.max_tokens}; it must be at least 1"
        if len(request.prompt) + request.max_tokens > self.max_seq_len:
            return (f"the prompt ({len(request.prompt)} tokens) plus max_tokens ({request.max_tokens}) exceeds "
                    f"the context of {self.max_seq_len} tokens")
        if not 0 < request.top_p <= 1 or request.temperature < 0:
            return "temperature must be >= 0 and top_p in (0, 1]"
        return ""

    def submit(self, request: Submit, *, is_probe: bool = False) -> Sequence | None:
        """Queue a request; None when the queue is full (back-pressure)."""
        if not is_probe and len(self.waiting) >= self.config.max_queue:
            return None
        seq = Sequence(request, list(request.prompt), is_probe=is_probe)
        self.waiting.append(seq)
        return seq

    def abort(self, request_id: str) -> Sequence | None:
        """Stop a request wherever it is; returns it (finished, slots freed) or None if unknown."""
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
            # An error may have left the slot's KV state half written: keep nothing of it.
            self._free_slots(seq, keep=not error)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        self.finished.append(seq)

    def _free_slots(self, seq: Sequence, keep: bool = False) -> None:
        """Give back the sequence's slots; with `keep`, its slot remembers the tokens its KV state holds."""
        # The twin's candidate stays named, so the canary can count the finished shadow sequence.
        if seq.slot >= 0 and seq.candidate_id in self.pools:
            self.pools[seq.candidate_id].give(seq.slot, seq.tokens[:seq.num_computed] if keep else None)
        if seq.twin_slot >= 0 and seq.twin_candidate in self.pools:
            self.pools[seq.twin_candidate].give(seq.twin_slot)
        seq.slot = seq.twin_slot = -1

    def drop_twin(self, seq: Sequence) -> None:
        """Stop mirroring `seq` (the canary ended)."""
        if seq.twin_slot >= 0 and seq.twin_candidate in self.pools:
            self.pools[seq.twin_candidate].give(seq.twin_slot)
        seq.twin_slot, seq.twin_candidate = -1, ""

    def migrate(self, seq: Sequence, candidate_id: str) -> None:
        """Move a running sequence to the front of the queue for `candidate_id`: it recomputes its tokens there."""
        self.running.remove(seq)
        self.drop_twin(seq)
        self._free_slots(seq)
        seq.candidate_id = candidate_id
        seq.num_computed = 0
        self.waiting.appendleft(seq)

    # -- a step -----------------------------------------------------------------------------------
    def _admit(self, route: Router, want_twin: Callable[[Sequence], str]) -> None:
        while self.waiting:
            seq = self.waiting[0]
            cid = seq.candidate_id or route(seq)
            pool = self.pools.get(cid)
            if pool is None or pool.num_free == 0:
                break  # FIFO: the head waits for a slot, the others wait behind it
            self.waiting.popleft()
            seq.candidate_id = cid  # first: the canary mirrors sequences by the candidate they run on
            twin = want_twin(seq)
            if twin and twin in self.pools and self.pools[twin].num_free > 0 and seq.num_computed == 0:
                # A mirrored sequence computes its whole prompt on both sides, so the two agree token for token.
                (seq.slot, _), (seq.twin_slot, _) = pool.take(), self.pools[twin].take()
                seq.twin_candidate = twin
            else:
                seq.slot, seq.num_cached = pool.take(seq.tokens if seq.num_computed == 0 else None)
                seq.num_computed = seq.num_cached
            self.running.append(seq)

    def schedule(self, route: Router, want_twin: Callable[[Sequence], str] | None = None) -> StepPlan:
        """Admit waiting sequences into free slots and pick this step's work under the token budget."""
        self._admit(route, want_twin or (lambda seq: ""))
        plan = StepPlan()
        budget = self.config.max_num_batched_tokens
        for seq in self.running:
            if seq.is_decoding:
                plan.decode.setdefault(seq.candidate_id, []).append(
                    Chunk(seq, seq.num_computed, seq.num_computed + 1))
                budget -= 1
        for seq in self.running:
            if seq.is_decoding or budget <= 0:
                continue
            n = min(len(seq.tokens) - seq.num_computed, budget)
            plan.prefill.setdefault(seq.candidate_id, []).append(Chunk(seq, seq.num_computed, seq.num_computed + n))
            budget -= n
        return plan

    def complete(self, chunk: Chunk, next_token: int | None) -> None:
        """Record that `chunk` ran; append the sampled token and finish the sequence on a stop id or a limit."""
        seq = chunk.seq
        seq.num_computed = chunk.end
        if next_token is None or not chunk.samples:
            return
        if next_token in seq.request.stop_ids:
            self.finish(seq, "stop")
            return
        seq.tokens.append(next_token)
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
