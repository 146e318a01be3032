"""A served sequence and the plan of one step, as the scheduler hands them to the executor: each sequence's tokens
and the KV pages that hold them, the chunks a step runs, and the log-probabilities a sampled token comes with."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from athanor.serve.messages import Submit


@dataclass(eq=False)
class Sequence:
    """One request's state in the worker."""

    request: Submit
    tokens: list[int]
    """Prompt, then generated tokens."""
    candidate_id: str = ""
    slot: int = -1
    """Row of the candidate's block table while running, else -1."""
    pages: list[int] = field(default_factory=list)
    """Pages of the candidate's pool holding its tokens, in order (token p in `pages[p // page_size]`), while running."""
    num_computed: int = 0
    """Tokens held in its KV pages."""
    num_cached: int = 0
    """Of those, the prompt tokens its KV already held when it was admitted (no prefill ran for them); set at
    its first admission (or a migration), not when it resumes from a preemption."""
    num_emitted: int = 0
    """Generated tokens already reported to the front end."""
    finish_reason: str | None = None
    error: str = ""
    is_probe: bool = False
    """A canary probe of the worker's own: nothing is reported for it."""
    twin_slot: int = -1
    """Slot of the shadow copy on the challenger (teacher-forced with this sequence's tokens), or -1."""
    twin_candidate: str = ""
    twin_pages: list[int] = field(default_factory=list)
    """The shadow copy's pages in the challenger's pool (same positions as `pages`, never shared)."""
    preemptions: int = 0
    """Times it was preempted for lack of pages (and recomputed)."""
    logprobs: list[float] = field(default_factory=list, repr=False)
    """Per generated token, its log-probability (when the request asks for them)."""
    top_ids: list[int] = field(default_factory=list, repr=False)
    """Per generated token, the request's k most likely tokens at that step (k each, in order)."""
    top_logprobs: list[float] = field(default_factory=list, repr=False)
    page_keys: list[bytes] = field(default_factory=list, repr=False)
    """Prefix-cache keys of its leading full pages, as far as computed so far (tokens never change, only grow)."""

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
class TokenLogprobs:
    """A sampled token's log-probability and the most likely tokens' at its step (`Submit.logprobs`)."""

    logprob: float
    top_ids: tuple[int, ...] = ()
    top_logprobs: tuple[float, ...] = ()


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


Router = Callable[[Sequence], str]
"""Picks the candidate a new sequence is prefilled on."""
