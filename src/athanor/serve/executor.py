"""Running a `StepPlan` on the engine's resident candidates, and the shadow runs of a canary.

Owned by the serving worker; tensors live on the engine's device. Decode rows go through the
candidate's `DecodeRunner` (static buffers, bucket padding, CUDA graph of decode + sampling);
prefill chunks are packed into one `PrefillBatch` per candidate and sampled after. A shadow run
feeds the challenger the very rows the incumbent just ran (same tokens and positions, the twins'
slots) and compares the two next-token distributions row by row.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from athanor.engine import group
from athanor.engine.candidate import format_exception
from athanor.engine.core import Engine, Resident, exit_if_device_broken
from athanor.engine.graphs import StepInputs, check_logits
from athanor.engine.pages import write_pages
from athanor.model import PrefillBatch
from athanor.model.sampling import sample
from athanor.serve.canary import Canary
from athanor.serve.scheduler import Scheduler
from athanor.serve.sequence import Chunk, StepPlan, TokenLogprobs

log = logging.getLogger(__name__)


class _Done:
    """What `torch.cuda.Event` is to a step queued on a GPU, for a device that runs each step as it is queued."""

    def record(self) -> None:
        pass

    def synchronize(self) -> None:
        pass


@dataclass
class Launched:
    """A step queued on the device: its rows, and where its tokens land on the host."""

    candidate_id: str
    rows: list[tuple[str, int]]
    """(request id, position fed) per row: what a later plan must ask for to use this step."""
    host: Tensor
    """[max_seqs] buffer (pinned on a GPU) the tokens are copied into, valid once `done` has fired."""
    done: torch.cuda.Event | _Done


@dataclass(frozen=True)
class StepFailure:
    """A candidate raised while running its part of a step (its rows did not advance)."""

    candidate_id: str
    error: str
    shadow: bool = False


def distribution_gap(ref: Tensor, cand: Tensor) -> tuple[list[float], list[bool]]:
    """Per row: KL(ref || cand) of the softmax distributions, and whether the argmaxes agree."""
    # ref, cand: [B, vocab]
    lp, lq = torch.log_softmax(ref.float(), -1), torch.log_softmax(cand.float(), -1)
    kl = (lp.exp() * (lp - lq)).sum(-1).clamp_min(0.0)
    kl = torch.nan_to_num(kl, nan=float("inf"))
    return kl.tolist(), (ref.argmax(-1) == cand.argmax(-1)).tolist()


class Executor:
    def __init__(self, engine: Engine, scheduler: Scheduler) -> None:
        self.engine = engine
        self.group = engine.group
        """The engine's layout group: its other ranks make each model call this executor makes (no chained steps)."""
        self.scheduler = scheduler
        self.device = engine.device
        self.vocab_size = engine.model.spec.vocab_size
        self._ahead: Launched | None = None
        """The decode step queued before the host saw the tokens of the one before (see `run`)."""
        self._pinned: list[Tensor] = []
        self._prefill_pinned: Tensor | None = None

    def _long(self, values: list[int]) -> Tensor:
        return torch.tensor(values, dtype=torch.long, device=self.device)

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def _run(self, resident: Resident, chunks: list[Chunk], decode: bool, twin: bool,
             while_running: Callable[[], None] | None = None) -> tuple[Tensor, Tensor, float]:
        """(sampled next tokens [B], logits [B, vocab], seconds) of `chunks` on `resident`;
        `while_running` is called once the step is queued on the device, before waiting for it."""
        x = self._inputs(chunks, twin, decode)
        t = time.perf_counter()
        with self.engine.armed():
            if decode:
                greedy = self._greedy(chunks)
                if self.group.size > 1:  # nothing built on a one-device step's path
                    self.group.publish(group.Decode(resident.candidate.id, x, greedy))
                out, logits, _ = resident.runner.step(x, greedy=greedy)
            else:
                out, logits = self._prefill(resident, chunks, x)
        if while_running is not None:
            while_running()  # host work (the previous step's report) overlaps this step's device work
        with self.engine.armed():
            self._sync()
        return out, logits, time.perf_counter() - t

    def _prefill(self, resident: Resident, chunks: list[Chunk], x: StepInputs) -> tuple[Tensor, Tensor]:
        """Queue the prefill chunks packed in one call, and the sampling of their next tokens: (tokens [B], logits
        [B, vocab]) on the device."""
        flat = [t for c in chunks for t in c.seq.tokens[c.start:c.end]]
        cu = [0]
        for c in chunks:
            cu.append(cu[-1] + c.end - c.start)
        positions = self._long([p for c in chunks for p in range(c.start, c.end)])
        batch = PrefillBatch(self._long(flat), self._long(cu), positions, x.slots, x.seq_lens)
        if self.group.size > 1:
            self.group.publish(group.Prefill(resident.candidate.id, batch))
        logits = check_logits(resident.forward.prefill(batch), len(chunks), self.vocab_size, "prefill()")
        last = self._long([c.end - 1 for c in chunks])
        return sample(logits, x.temperature, x.top_p, x.seeds, last), logits

    def _inputs(self, chunks: list[Chunk], twin: bool, decode: bool) -> StepInputs:
        """The rows' slots, seeds, starts, sampling settings and (decode) fed tokens on the device; a
        prefill's `tokens` and `positions` are left as the starts (it packs its own)."""
        req = [c.seq.request for c in chunks]
        # One host-to-device copy per dtype, not one per field: each blocking copy from pageable
        # memory costs the step loop host time that a small decode step feels.
        int_rows = [[c.seq.twin_slot if twin else c.seq.slot for c in chunks], [r.seed for r in req],
                    [c.start for c in chunks]]
        if decode:
            int_rows.append([c.seq.tokens[c.start] for c in chunks])  # the token each row feeds
        ints = self._rows(int_rows, torch.long)
        floats = self._rows([[r.temperature for r in req], [r.top_p for r in req]], torch.float32)
        starts = ints[2]
        return StepInputs(ints[3] if decode else starts, starts, ints[0], starts, floats[0], floats[1], ints[1])

    def _rows(self, rows: list[list[int]] | list[list[float]], dtype: torch.dtype) -> Tensor:
        """Equal-length host lists as one [len(rows), B] tensor on the device (one copy)."""
        return torch.tensor(rows, dtype=dtype).to(self.device, non_blocking=True)

    def run(self, plan: StepPlan, canary: Canary | None,
            while_running: Callable[[], None] | None = None, chain: bool = False) -> list[StepFailure]:
        """Run every candidate's part of the step, then the shadow runs; advance the sequences that ran.
        `while_running` is called once, while the device runs the first part.

        `chain` (the caller vouches that no canary runs): a step whose decode rows run on one candidate with
        captured graphs also queues the decode step after it before waiting for its tokens, fed on the device
        (`DecodeRunner.step_again`), so the host's work between two steps (the tokens, the bookkeeping, the
        report, the next plan) overlaps the device's instead of idling it. The next `run` uses that step if its
        plan asks for exactly those decode rows at those positions, whatever prefill chunks join it (they run on
        their own after it); otherwise it is dropped (its cache writes are rewritten, or belong to a freed slot).
        So it is queued only when no row is known to leave (its token limit) and no prefill chunk of this step
        samples (that sequence would join the next step's decode rows)."""
        self._map_pages()
        ahead, self._ahead = self._ahead, None
        # Decode rows that want log-probabilities need their step's logits, which a queued step does not keep.
        decode_logprobs = any(self._wants_logprobs(chunks) for chunks in plan.decode.values())
        if ahead is not None and (decode_logprobs or not self._continues(ahead, plan)):
            ahead.done.synchronize()  # dropped: let it finish before anything can free what it uses
            ahead = None
        if ((chain or ahead is not None) and not decode_logprobs and len(plan.decode) == 1 and self.group.size == 1
                and set(plan.prefill) <= set(plan.decode)):
            (cid, chunks), = plan.decode.items()
            resident = self.engine.residents.get(cid)
            if resident is not None and resident.runner.captured:
                try:
                    return self._run_chained(resident, cid, chunks, plan.prefill.get(cid, []), ahead, while_running,
                                             queue_next=chain)
                except Exception as e:
                    exit_if_device_broken(e)
                    return [StepFailure(cid, f"candidate {cid}: {format_exception(e, 6)}")]
        failures: list[StepFailure] = []
        for decode, parts in ((True, plan.decode), (False, plan.prefill)):
            for cid, chunks in parts.items():
                resident = self.engine.residents.get(cid)
                if resident is None:
                    failures.append(StepFailure(cid, f"candidate {cid} is not resident"))
                    continue
                try:
                    tokens, logits, seconds = self._run(resident, chunks, decode, twin=False,
                                                        while_running=while_running)
                    while_running = None
                except Exception as e:
                    exit_if_device_broken(e)
                    failures.append(StepFailure(cid, f"candidate {cid}: {format_exception(e, 6)}"))
                    continue
                if canary is not None and not canary.finished:
                    failure = self._shadow(canary, chunks, decode, logits, seconds)
                    if failure is not None:
                        failures.append(failure)
                for chunk, token, logprobs in zip(chunks, tokens.tolist(), self._logprobs(chunks, tokens, logits)):
                    self.scheduler.complete(chunk, int(token), logprobs)
        return failures

    @staticmethod
    def _wants_logprobs(chunks: list[Chunk]) -> bool:
        return any(c.seq.request.logprobs >= 0 for c in chunks)

    @staticmethod
    def _logprobs(chunks: list[Chunk], tokens: Tensor, logits: Tensor) -> list[TokenLogprobs | None]:
        """Per chunk, its sampled token's log-probability and its request's k most likely tokens' (the raw
        distribution, `Submit.logprobs`), where the request asks for them and the chunk samples; else None."""
        out: list[TokenLogprobs | None] = [None] * len(chunks)
        want = [i for i, c in enumerate(chunks) if c.samples and c.seq.request.logprobs >= 0]
        if not want:
            return out
        rows = torch.tensor(want, device=logits.device)
        lp = torch.log_softmax(logits.index_select(0, rows).float(), -1)
        chosen = lp.gather(1, tokens.index_select(0, rows)[:, None].long()).squeeze(1).tolist()
        k = max(chunks[i].seq.request.logprobs for i in want)
        top_values, top_ids = lp.topk(k, -1) if k else (lp[:, :0], lp[:, :0].long())
        values, ids = top_values.tolist(), top_ids.tolist()
        for j, i in enumerate(want):
            n = chunks[i].seq.request.logprobs
            out[i] = TokenLogprobs(chosen[j], tuple(ids[j][:n]), tuple(values[j][:n]))
        return out

    def _map_pages(self) -> None:
        """Copy the scheduler's page assignments into each resident's block table, behind any step queued on the
        device (stream order: a step queued before reads the table as it was when it was planned)."""
        for cid, pool in self.scheduler.page_pools.items():
            updates = pool.take_updates()
            resident = self.engine.residents.get(cid)
            if resident is not None and updates:
                if self.group.size > 1:
                    self.group.publish(group.Pages(cid, updates))
                write_pages(resident.ctx.table, updates)

    def settle(self) -> None:
        """Wait for a step queued ahead (before a candidate it may run on can be dropped)."""
        if self._ahead is not None:
            self._ahead.done.synchronize()
            self._ahead = None

    @staticmethod
    def _greedy(chunks: list[Chunk]) -> bool:
        """Every row samples greedily: the step replays the bucket's argmax graph."""
        return all(c.seq.request.temperature <= 0 for c in chunks)

    @staticmethod
    def _rows_of(chunks: list[Chunk]) -> list[tuple[str, int]]:
        return [(c.seq.request_id, c.start) for c in chunks]

    def _continues(self, ahead: Launched, plan: StepPlan) -> bool:
        """Whether `plan`'s decode rows are exactly the step queued ahead's, at the positions it fed (prefill
        chunks on the same candidate may join)."""
        return (list(plan.decode) == [ahead.candidate_id] and set(plan.prefill) <= {ahead.candidate_id}
                and self._rows_of(plan.decode[ahead.candidate_id]) == ahead.rows)

    def _run_chained(self, resident: Resident, cid: str, chunks: list[Chunk], prefill: list[Chunk],
                     ahead: Launched | None, while_running: Callable[[], None] | None,
                     queue_next: bool) -> list[StepFailure]:
        # `ahead` is the step queued by the last run, already running (`run` dropped it unless it fits).
        # Stream order: this step's decode, its prefill chunks, then the decode step queued after it, so waiting
        # for the prefill's tokens never waits for that next step.
        current = ahead if ahead is not None else self._launch(resident, cid, chunks)
        prefilled, prefill_logits = None, None
        if prefill:
            with self.engine.armed():
                tokens, prefill_logits = self._prefill(resident, prefill, self._inputs(prefill, twin=False,
                                                                                       decode=False))
            prefilled = self._record(cid, self._rows_of(prefill), tokens, self._prefill_host())
        # (Log-probabilities are read only for chunks that sample, and then nothing is queued behind them.)
        if (queue_next and not any(c.samples for c in prefill) and not self._wants_logprobs(chunks)
                and all(c.seq.num_generated + 1 < c.seq.request.max_tokens for c in chunks)):
            with self.engine.armed():
                again = resident.runner.step_again()
            if again is not None:
                self._ahead = self._record(cid, [(r, p + 1) for r, p in current.rows], again[0])
        if while_running is not None:
            while_running()
        with self.engine.armed():
            current.done.synchronize()
        for chunk, token in zip(chunks, current.host[:len(chunks)].tolist()):
            self.scheduler.complete(chunk, int(token))
        if prefilled is not None and prefill_logits is not None:
            with self.engine.armed():
                prefilled.done.synchronize()
            tokens = prefilled.host[:len(prefill)]
            for chunk, token, logprobs in zip(prefill, tokens.tolist(),
                                              self._logprobs(prefill, tokens.to(self.device), prefill_logits)):
                self.scheduler.complete(chunk, int(token), logprobs)
        return []

    def _launch(self, resident: Resident, cid: str, chunks: list[Chunk]) -> Launched:
        x = self._inputs(chunks, twin=False, decode=True)
        with self.engine.armed():
            tokens, _, _ = resident.runner.step(x, greedy=self._greedy(chunks))
        return self._record(cid, self._rows_of(chunks), tokens)

    def _record(self, cid: str, rows: list[tuple[str, int]], tokens: Tensor, host: Tensor | None = None) -> Launched:
        """Copy a queued step's tokens to a pinned host buffer behind it and mark when they are there. Decode steps
        alternate between two buffers (the step in hand and the one queued after it); a prefill passes its own."""
        if host is None:
            if not self._pinned:
                self._pinned = [self._pinned_tokens() for _ in range(2)]
            self._pinned.reverse()
            host = self._pinned[0]
        cuda = self.device.type == "cuda"
        host[:tokens.shape[0]].copy_(tokens, non_blocking=cuda)
        done = torch.cuda.Event() if cuda else _Done()
        done.record()
        return Launched(cid, rows, host, done)

    def _pinned_tokens(self) -> Tensor:
        return torch.empty(self.engine.config.max_seqs, dtype=torch.long, pin_memory=self.device.type == "cuda")

    def _prefill_host(self) -> Tensor:
        if self._prefill_pinned is None:
            self._prefill_pinned = self._pinned_tokens()
        return self._prefill_pinned

    def _shadow(self, canary: Canary, chunks: list[Chunk], decode: bool, logits: Tensor,
                seconds: float) -> StepFailure | None:
        rows = [i for i, c in enumerate(chunks) if c.seq.twin_candidate == canary.candidate_id and c.seq.twin_slot >= 0]
        challenger = self.engine.residents.get(canary.candidate_id)
        if not rows or challenger is None:
            return None
        twins = [chunks[i] for i in rows]
        try:
            _, twin_logits, twin_seconds = self._run(challenger, twins, decode, twin=True)
        except Exception as e:
            exit_if_device_broken(e)
            return StepFailure(canary.candidate_id, format_exception(e, 6), shadow=True)
        kls, agree = distribution_gap(logits[rows], twin_logits)
        canary.observe_rows(kls, agree)
        if decode and len(rows) == len(chunks):  # identical batches: a paired timing
            canary.observe_step_times(seconds, twin_seconds)
        return None
