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

from athanor.engine.candidate import format_exception
from athanor.engine.core import Engine, Resident, exit_if_device_broken
from athanor.engine.graphs import StepInputs, check_logits
from athanor.model import PrefillBatch
from athanor.model.sampling import sample
from athanor.serve.canary import Canary
from athanor.serve.scheduler import Chunk, Scheduler, StepPlan

log = logging.getLogger(__name__)


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
        self.scheduler = scheduler
        self.device = engine.device
        self.vocab_size = engine.model.spec.vocab_size

    def _long(self, values: list[int]) -> Tensor:
        return torch.tensor(values, dtype=torch.long, device=self.device)

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def _run(self, resident: Resident, chunks: list[Chunk], decode: bool, twin: bool,
             while_running: Callable[[], None] | None = None) -> tuple[Tensor, Tensor, float]:
        """(sampled next tokens [B], logits [B, vocab], seconds) of `chunks` on `resident`;
        `while_running` is called once the step is queued on the device, before waiting for it."""
        req = [c.seq.request for c in chunks]
        # One host-to-device copy per dtype, not one per field: each blocking copy from pageable
        # memory costs the step loop ~10 us of host time, and a batch-1 decode step is ~1-3 ms.
        int_rows = [[c.seq.twin_slot if twin else c.seq.slot for c in chunks], [r.seed for r in req],
                    [c.start for c in chunks]]
        if decode:
            int_rows.append([c.seq.tokens[c.start] for c in chunks])  # the token each row feeds
        ints = self._rows(int_rows, torch.long)
        floats = self._rows([[r.temperature for r in req], [r.top_p for r in req]], torch.float32)
        slots, seeds, starts, temperature, top_p = ints[0], ints[1], ints[2], floats[0], floats[1]
        t = time.perf_counter()
        with self.engine._armed():
            if decode:
                out, logits, _ = resident.runner.step(
                    StepInputs(ints[3], starts, slots, starts, temperature, top_p, seeds),
                    greedy=all(r.temperature <= 0 for r in req))
            else:
                flat = [t for c in chunks for t in c.seq.tokens[c.start:c.end]]
                cu = [0]
                for c in chunks:
                    cu.append(cu[-1] + c.end - c.start)
                positions = self._long([p for c in chunks for p in range(c.start, c.end)])
                batch = PrefillBatch(self._long(flat), self._long(cu), positions, slots, starts)
                logits = check_logits(resident.forward.prefill(batch), len(chunks), self.vocab_size, "prefill()")
                last = self._long([c.end - 1 for c in chunks])
                out = sample(logits, temperature, top_p, seeds, last)
        if while_running is not None:
            while_running()  # host work (the previous step's report) overlaps this step's device work
        with self.engine._armed():
            self._sync()
        return out, logits, time.perf_counter() - t

    def _rows(self, rows: list[list[int]] | list[list[float]], dtype: torch.dtype) -> Tensor:
        """Equal-length host lists as one [len(rows), B] tensor on the device (one copy)."""
        return torch.tensor(rows, dtype=dtype).to(self.device, non_blocking=True)

    def run(self, plan: StepPlan, canary: Canary | None,
            while_running: Callable[[], None] | None = None) -> list[StepFailure]:
        """Run every candidate's part of the step, then the shadow runs; advance the sequences that ran.
        `while_running` is called once, while the device runs the first part."""
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
                for chunk, token in zip(chunks, tokens.tolist()):
                    self.scheduler.complete(chunk, int(token))
        return failures

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
