"""Step scripts: the fresh, real-text inputs every check and every timing runs on.

A script is a tuple of `ScriptStep`s the engine runs on every listed candidate
(`TrajectoryRequest`). Tokens come from real text (`athanor.traffic.corpus`, through the
model's tokenizer; ids are folded into the vocabulary of random-weight presets) at a random
offset drawn from the evaluator's seed, so no two scripts repeat and nothing can be memoised.
Decode steps are teacher-forced on the text (each step's `next_tokens` is the token after it,
whose log-probability gives perplexity); prefill lengths are jittered so a timed prefill length
is one the candidate has not seen in warm-up.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from functools import cache

import numpy as np
import torch

from athanor.engine.protocol import ScriptStep
from athanor.evaluate.objective import StepShape
from athanor.model.seam import PAGE_SIZE

log = logging.getLogger(__name__)


@cache
def _corpus_ids() -> tuple[int, ...]:
    from athanor.traffic.corpus import encoded_sentences

    try:
        from athanor.model.registry import load_tokenizer

        tokenizer = load_tokenizer()
        ids = [t for s in encoded_sentences(tokenizer) for t in s]
    except Exception as e:  # no cached tokenizer: bytes of the text still follow language statistics
        log.info("no tokenizer for real text (%s); using the corpus' bytes", e)
        from athanor.traffic.corpus import sentences

        ids = list(" ".join(sentences()).encode())
    return tuple(ids)


class TextSource:
    """Token ids of real text at seeded random offsets, folded into `vocab_size`."""

    def __init__(self, vocab_size: int, seed: int) -> None:
        self.ids = np.asarray(_corpus_ids(), dtype=np.int64) % vocab_size
        self.rng = np.random.default_rng(seed)

    def take(self, n: int) -> list[int]:
        start = int(self.rng.integers(0, len(self.ids)))
        reps = (start + n) // len(self.ids) + 1
        return np.tile(self.ids, reps)[start:start + n].tolist()


def _long(values: list[int]) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.long)


def prefill_step(prompts: list[list[int]], slots: list[int], starts: list[int], next_tokens: list[int],
                 keep_logits: bool = False) -> ScriptStep:
    cu = np.cumsum([0] + [len(q) for q in prompts]).tolist()
    positions = [s + i for q, s in zip(prompts, starts, strict=True) for i in range(len(q))]
    return ScriptStep("prefill", _long([t for q in prompts for t in q]), _long(positions), _long(slots),
                      _long(starts), cu_seqlens=_long(cu), next_tokens=_long(next_tokens), keep_logits=keep_logits)


PREFILL_TOKENS = 8192
"""Most tokens one prefill step of a script carries (vLLM's default token budget per step is of this order):
a decode shape's setup prefills batch x context tokens, whose activations in one step (an 8B model's MLP
intermediate at 19 x 4096 tokens is 2 GiB) would not fit beside the cache; longer setups are split into
several steps, prompts packed whole where they fit, chunked (as a continued prefill) where one is longer
than the budget."""


def prefill_steps(prompts: list[list[int]], slots: list[int], starts: list[int], next_tokens: list[int],
                  keep_logits: bool = False, budget: int = PREFILL_TOKENS) -> list[ScriptStep]:
    """`prefill_step` split into steps of at most `budget` tokens (see PREFILL_TOKENS): the same cache
    contents and, for each prompt, the same last-position logits."""
    pieces: list[tuple[list[int], int, int, int]] = []  # (tokens, slot, start, next token), in order
    for q, slot, start, nxt in zip(prompts, slots, starts, next_tokens, strict=True):
        for lo in range(0, len(q), budget):
            hi = min(lo + budget, len(q))
            pieces.append((q[lo:hi], slot, start + lo, q[hi] if hi < len(q) else nxt))

    def step(batch: list[tuple[list[int], int, int, int]]) -> ScriptStep:
        return prefill_step([b[0] for b in batch], [b[1] for b in batch], [b[2] for b in batch],
                            [b[3] for b in batch], keep_logits=keep_logits)

    steps: list[ScriptStep] = []
    batch: list[tuple[list[int], int, int, int]] = []
    tokens = 0
    for piece in pieces:  # one slot's chunks are budget-sized but the last, so never two in one step
        if batch and tokens + len(piece[0]) > budget:
            steps.append(step(batch))
            batch, tokens = [], 0
        batch.append(piece)
        tokens += len(piece[0])
    if batch:
        steps.append(step(batch))
    return steps


def decode_step(tokens: list[int], positions: list[int], slots: list[int], next_tokens: list[int],
                keep_logits: bool = False) -> ScriptStep:
    return ScriptStep("decode", _long(tokens), _long(positions), _long(slots), _long(positions),
                      next_tokens=_long(next_tokens), keep_logits=keep_logits)


@dataclass(frozen=True)
class Script:
    steps: tuple[ScriptStep, ...]
    timed: tuple[int, ...]
    """Indices of the steps whose times price the shape (after warm-up)."""
    setup: tuple[int, ...] = ()
    """Indices of the steps that only build a timed step's context (the prompts before decode steps, the cached
    part before a prefill chunk): neither timed nor warm-up, so the sides may run them at once."""


def decode_script(text: TextSource, shape: StepShape, num_steps: int, warmup: int, max_seq_len: int,
                  keep_every: int = 0) -> Script:
    """Prefill `batch_size` prompts of about `context_len` tokens, then teacher-forced decode steps;
    a new round of prompts whenever the slots are full. The first `warmup` decode steps are not timed."""
    b = shape.batch_size
    steps: list[ScriptStep] = []
    timed: list[int] = []
    setup: list[int] = []
    room = max(2, max_seq_len - shape.context_len - 1)
    done = 0
    while done < num_steps + warmup:
        k = min(room, num_steps + warmup - done)
        lens = [max(1, shape.context_len - int(text.rng.integers(0, 3))) for _ in range(b)]
        texts = [text.take(n + k + 1) for n in lens]
        first = len(steps)
        steps += prefill_steps([t[:n] for t, n in zip(texts, lens, strict=True)], list(range(b)), [0] * b,
                               [t[n] for t, n in zip(texts, lens, strict=True)])
        setup += range(first, len(steps))
        for j in range(k):
            if done >= warmup:
                timed.append(len(steps))
            keep = keep_every > 0 and done % keep_every == 0
            steps.append(decode_step([t[n + j] for t, n in zip(texts, lens, strict=True)], [n + j for n in lens],
                                     list(range(b)), [t[n + j + 1] for t, n in zip(texts, lens, strict=True)], keep))
            done += 1
    return Script(tuple(steps), tuple(timed), tuple(setup))


def prefill_script(text: TextSource, shape: StepShape, num_steps: int, warmup: int, num_slots: int) -> Script:
    """Chunks of about `tokens` new tokens on `context_len` cached ones, each length jittered (mostly
    unseen in warm-up); the cached part is prefilled first, untimed, in the same slot. Full logits are
    kept for every 4th of the first 64 steps (every step is fingerprinted)."""
    timed, setup = [], []
    steps: list[ScriptStep] = []
    for i in range(num_steps + warmup):
        slot = i % num_slots
        chunk = max(1, shape.tokens - int(text.rng.integers(0, max(2, shape.tokens // 4))))
        ids = text.take(shape.context_len + chunk + 1)
        if shape.context_len:
            setup.append(len(steps))
            steps.append(prefill_step([ids[:shape.context_len]], [slot], [0], [ids[shape.context_len]]))
        if i >= warmup:
            timed.append(len(steps))
        steps.append(prefill_step([ids[shape.context_len:shape.context_len + chunk]], [slot], [shape.context_len],
                                  [ids[shape.context_len + chunk]], keep_logits=i % 4 == 0 and i < 64))
    return Script(tuple(steps), tuple(timed), tuple(setup))


def check_script(text: TextSource, max_seqs: int, max_seq_len: int, num_decode: int = 8,
                 max_tokens: int = 0) -> Script:
    """The correctness script: several batch sizes and context lengths, a fresh prefill, a continued
    (chunked) prefill, and decode steps; full logits kept for most steps; then a prefix shared between two
    slots (`shared_prefix_step`). `max_tokens` (0: no cap) bounds the prompt tokens of each batch, which
    bounds the check's cost on a slow device."""
    steps: list[ScriptStep] = []
    texts: list[list[int]] = []
    lens: list[int] = []
    for b, ctx in sorted({(1, 5), (min(3, max_seqs), max_seq_len // 4), (max_seqs, max_seq_len // 2)}):
        ctx = max(2, min(ctx, max_seq_len - num_decode - 2, max_tokens // b if max_tokens else ctx))
        lens = [max(2, ctx - 2 * i) for i in range(b)]
        texts = [text.take(n + num_decode + 1) for n in lens]
        head = [n // 2 for n in lens]  # first half, then the rest as a continued prefill
        steps += prefill_steps([t[:h] for t, h in zip(texts, head, strict=True)], list(range(b)), [0] * b,
                               [t[h] for t, h in zip(texts, head, strict=True)], keep_logits=True)
        steps += prefill_steps([t[h:n] for t, h, n in zip(texts, head, lens, strict=True)], list(range(b)), head,
                               [t[n] for t, n in zip(texts, lens, strict=True)], keep_logits=True)
        for j in range(num_decode):
            steps.append(decode_step([t[n + j] for t, n in zip(texts, lens, strict=True)], [n + j for n in lens],
                                     list(range(b)), [t[n + j + 1] for t, n in zip(texts, lens, strict=True)],
                                     keep_logits=j % 2 == 0))
    if len(lens) > 1 and (shared := shared_prefix_step(text, lens[0], max_seq_len)) is not None:
        steps.append(shared)
    return Script(tuple(steps), tuple(range(len(steps))))


def shared_prefix_step(text: TextSource, held: int, max_seq_len: int, page_size: int = PAGE_SIZE
                       ) -> ScriptStep | None:
    """Slot 1 continues the first half of the `held` tokens in slot 0's pages, which it borrows for the step (`ScriptStep.shared`), with new text: the keys it attends to are slot 0's, as after a server's prefix
    cache hit. A forward that keeps its own per-slot addressing instead of reading the block table attends to
    slot 1's stale keys and fails the comparison. None when slot 0 holds less than a page."""
    pages = held // 2 // page_size
    n = pages * page_size
    more = min(8, max_seq_len - n - 1)
    if pages == 0 or more < 1:
        return None
    new = text.take(more + 1)
    step = prefill_step([new[:more]], [1], [n], [new[more]], keep_logits=True)
    return dataclasses.replace(step, shared=_long([0, 1, pages]))


def smoke_script(text: TextSource) -> Script:
    ids = text.take(6)
    return Script((prefill_step([ids[:4]], [0], [0], [ids[4]]), decode_step([ids[4]], [4], [0], [ids[5]])), (1,))
