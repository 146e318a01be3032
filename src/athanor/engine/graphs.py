"""`DecodeRunner`: the engine's static decode buffers, bucket padding and CUDA graphs.

Owned by the engine, one per resident candidate, on the model's device. A decode batch of B
rows is copied into the static buffers, padded up to the next bucket with rows that point at
the padding slot `max_seqs`, and the captured graph of decode + sampling for that bucket is
replayed. On CPU, or for a candidate that is not graph-safe, the same step runs eagerly: unpadded, unless the
forward declares `static_shapes` (a decode compiled for fixed shapes), whose steps are padded to their bucket as a
graph's are and whose every bucket runs once at the swap (`warm`), so no compile lands in a timed step.

Each bucket has two graphs: decode + `sample` (temperature, top-p: a softmax and a sort over the
vocabulary, a real share of a step at a large vocabulary) and decode + argmax, which a step whose
every row is greedy replays instead (the caller knows its rows' temperatures on the host). Both are
captured up front, into one memory pool (never in the middle of a run). A process's first graphs on a
device are captured, dropped and captured again: first graphs replay slower under PDL (`DecodeRunner.capture`).
"""

from __future__ import annotations

import bisect
import functools
import logging
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from athanor.errors import CandidateError
from athanor.kernels.dispatch import HAS_TRITON
from athanor.kernels.sampling import greedy as argmax
from athanor.model import DecodeBatch, Forward
from athanor.model.sampling import sample

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class StepInputs:
    """One decode step's rows, on the engine's device. All [B]."""

    tokens: Tensor  # int64
    positions: Tensor  # int64
    slots: Tensor  # int64
    seq_lens: Tensor  # int64
    temperature: Tensor  # fp32
    top_p: Tensor  # fp32
    seeds: Tensor  # int64


ALL_INPUTS = tuple(StepInputs.__dataclass_fields__)
GREEDY_INPUTS = ("tokens", "positions", "slots", "seq_lens")
"""The inputs the argmax graph reads: a greedy step stages only these (each field is a copy on the device, in the
step's time); the sampling fields are staged by the steps that sample, with every other field."""


def check_logits(logits: object, num_rows: int, vocab_size: int, where: str) -> Tensor:
    """`logits` if it is a [num_rows, vocab] float tensor, else a CandidateError that says what it is."""
    if not isinstance(logits, Tensor):
        raise CandidateError(f"{where} returned {type(logits).__name__}, expected a Tensor [{num_rows}, {vocab_size}]")
    if tuple(logits.shape) != (num_rows, vocab_size) or not logits.is_floating_point():
        raise CandidateError(f"{where} returned a {logits.dtype} tensor of shape {list(logits.shape)}, "
                             f"expected a float tensor [{num_rows}, {vocab_size}]")
    return logits


def check_tokens(tokens: object, num_rows: int, where: str) -> Tensor:
    """`tokens` if it is an int64 tensor [num_rows], else a CandidateError that says what it is."""
    if not isinstance(tokens, Tensor) or tuple(tokens.shape) != (num_rows,) or tokens.dtype != torch.long:
        what = f"a {tokens.dtype} tensor of shape {list(tokens.shape)}" if isinstance(tokens, Tensor) else \
            type(tokens).__name__
        raise CandidateError(f"{where} returned {what} as its tokens, expected an int64 tensor [{num_rows}]")
    return tokens


def _argmax(logits: Tensor) -> Tensor:
    """The greedy tokens: one Triton launch on a GPU (faster than PyTorch's reductions over a large vocabulary),
    `torch.argmax` elsewhere (never Triton's CPU interpreter, which tests switch on process-wide)."""
    return argmax(logits, impl="triton" if logits.is_cuda and HAS_TRITON else "torch")


@functools.cache
def capture_stream(device: torch.device) -> torch.cuda.Stream:
    """One side stream per device for every capture.

    cuBLAS keeps a workspace per (handle, stream) for the life of the process; a fresh stream
    per capture would leave one workspace behind per swap.
    """
    return torch.cuda.Stream(device)


_graphs_warmed: set[torch.device] = set()
"""The devices on which this process has captured (and dropped) its first decode graphs."""


@functools.cache
def _throwaway_stream(device: torch.device) -> torch.cuda.Stream:
    """The stream a process's first, dropped decode graphs are captured on (see `DecodeRunner.capture`)."""
    return torch.cuda.Stream(device)


class DecodeRunner:
    def __init__(self, forward: Forward, max_seqs: int, vocab_size: int, device: torch.device,
                 buckets: tuple[int, ...]) -> None:
        self.forward = forward
        self.max_seqs = max_seqs
        self.vocab_size = vocab_size
        self.device = device
        self.buckets = tuple(sorted(set(buckets)))
        rows = self.buckets[-1]
        self._in = StepInputs(
            tokens=torch.zeros(rows, dtype=torch.long, device=device),
            positions=torch.zeros(rows, dtype=torch.long, device=device),
            slots=torch.full((rows,), max_seqs, dtype=torch.long, device=device),
            seq_lens=torch.zeros(rows, dtype=torch.long, device=device),
            temperature=torch.zeros(rows, dtype=torch.float32, device=device),
            top_p=torch.ones(rows, dtype=torch.float32, device=device),
            seeds=torch.zeros(rows, dtype=torch.long, device=device),
        )
        self._graphs: dict[tuple[int, bool], tuple[torch.cuda.CUDAGraph, Tensor, Tensor]] = {}
        """(rows, greedy) -> (graph, its output tokens, its output logits)."""
        self._pool: Any = None  # the graphs' shared memory pool handle
        self._last: tuple[int, int, bool] | None = None
        """(rows, bucket, greedy) of the last graph replayed (what `step_again` continues)."""
        self.static = bool(getattr(forward, "static_shapes", False))
        """Eager steps padded to their bucket: the forward compiles its decode for the buckets' shapes alone."""
        self.forward_tokens = False
        """Whether a greedy step took its tokens from the forward's `decode_greedy` (a graph captured one, say): set
        once and kept, so that a forward dropping the method afterwards does not escape the evaluator's check."""

    @property
    def captured(self) -> bool:
        return bool(self._graphs)

    def _pad_from(self, start: int, fields: tuple[str, ...] = ALL_INPUTS) -> None:
        # Padding rows feed token 0 at position 0 of the padding slot, greedily.
        pads = {"slots": self.max_seqs, "top_p": 1.0}
        for name in fields:
            getattr(self._in, name)[start:].fill_(pads.get(name, 0))

    def eager(self, x: StepInputs, greedy: bool = False) -> tuple[Tensor, Tensor]:
        """(next tokens [B], logits [B, vocab]) of one decode step, without graphs; `greedy`: every
        row's temperature is <= 0 (the caller vouches), so the tokens are the argmax: the forward's own
        `decode_greedy` where it has one (see `athanor.model.seam.Forward`), else the engine's argmax."""
        batch = DecodeBatch(x.tokens, x.positions, x.slots, x.seq_lens)
        rows = int(x.tokens.shape[0])
        fused = getattr(self.forward, "decode_greedy", None) if greedy else None
        if fused is not None:
            self.forward_tokens = True
            out = fused(batch)
            if not (isinstance(out, tuple) and len(out) == 2):
                raise CandidateError(f"decode_greedy() returned {type(out).__name__}, expected (tokens [{rows}], "
                                     f"logits [{rows}, {self.vocab_size}])")
            tokens, logits = out[0], check_logits(out[1], rows, self.vocab_size, "decode_greedy()")
            return check_tokens(tokens, rows, "decode_greedy()"), logits
        logits = check_logits(self.forward.decode(batch), rows, self.vocab_size, "decode()")
        if greedy:
            return _argmax(logits), logits
        return sample(logits, x.temperature, x.top_p, x.seeds, x.positions), logits

    def _view(self, rows: int) -> StepInputs:
        b = self._in
        return StepInputs(*(getattr(b, f)[:rows] for f in StepInputs.__dataclass_fields__))

    def warm(self, rounds: int = 1) -> None:
        """Run decode on the padding rows of every bucket, `rounds` times: lazy inits, autotuning, compiles and the
        allocator's growth happen here, at the swap, not in a step that is timed."""
        self._pad_from(0)
        # A forward's own greedy path is other code than its decode (a kernel to tune, say): warmed too.
        paths = (False, True) if getattr(self.forward, "decode_greedy", None) is not None else (False,)
        for _ in range(rounds):
            for rows in self.buckets:
                for greedy in paths:
                    self.eager(self._view(rows), greedy)

    def capture(self) -> None:
        """Capture decode + sampling for every bucket (largest first, sharing one memory pool)."""
        stream = capture_stream(self.device)
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(stream):  # warm-up outside capture
            self.warm(rounds=2)
        torch.cuda.current_stream(self.device).wait_stream(stream)
        device = torch.device("cuda", self.device.index if self.device.index is not None else
                              torch.cuda.current_device())
        if device not in _graphs_warmed:
            # The first graphs a process captures on a device replay slower for as long as they live (under
            # programmatic dependent launch), so, as NVIDIA advises for a new context, a first set is captured and
            # dropped. On a stream of its own: cuBLAS allocates a stream's workspace at its first call there, inside
            # the capture's pool, and a workspace the kept graphs use must not lie in the dropped pool (clearing
            # cuBLAS workspaces would unmap memory they write).
            self._capture_buckets(stream=_throwaway_stream(device))
            self._graphs.clear()
            self._pool = None
            _graphs_warmed.add(device)
        self._capture_buckets()
        log.debug("captured decode graphs for buckets %s", self.buckets)

    def _capture_buckets(self, stream: torch.cuda.Stream | None = None) -> None:
        for rows in reversed(self.buckets):
            for greedy in (False, True):
                self._capture(rows, greedy, stream)
        torch.cuda.synchronize(self.device)

    def _capture(self, rows: int, greedy: bool, stream: torch.cuda.Stream | None = None) -> None:
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pool, stream=stream):  # None: PyTorch's own capture stream
            out_tokens, out_logits = self.eager(self._view(rows), greedy)
        self._pool = graph.pool()
        self._graphs[(rows, greedy)] = (graph, out_tokens, out_logits)

    def stage(self, x: StepInputs, greedy: bool = False) -> tuple[torch.cuda.CUDAGraph, Tensor, Tensor] | None:
        """Copy `x` into the static inputs, pad to its bucket, and return that bucket's (graph, output
        tokens, output logits) to replay — the argmax graph when `greedy`; None when no graph fits."""
        num_rows = int(x.tokens.shape[0])
        bucket = self._bucket(num_rows)
        if not self._graphs or bucket is None:
            return None
        self._copy_in(x, num_rows, GREEDY_INPUTS if greedy else ALL_INPUTS)
        self._last = (num_rows, bucket, greedy)
        return self._graphs[(bucket, greedy)]

    def _bucket(self, num_rows: int) -> int | None:
        """The smallest bucket that holds `num_rows` rows; None past the largest."""
        i = bisect.bisect_left(self.buckets, num_rows)
        return self.buckets[i] if i < len(self.buckets) else None

    def _copy_in(self, x: StepInputs, num_rows: int, fields: tuple[str, ...]) -> None:
        """`x`'s `fields` into the static inputs, the rows after them padding."""
        # One multi-tensor launch per dtype rather than one per field: launches are most of a small batch's staging.
        torch._foreach_copy_([getattr(self._in, name)[:num_rows] for name in fields],
                             [getattr(x, name) for name in fields], non_blocking=True)
        self._pad_from(num_rows, fields)

    def step(self, x: StepInputs, greedy: bool = False) -> tuple[Tensor, Tensor, bool]:
        """(next tokens [B], logits [B, vocab], whether a graph ran) for rows already on the device.

        `greedy`: every row's temperature is <= 0 (known to the caller on the host); the step then
        replays the bucket's argmax graph instead of the sampling one."""
        staged = self.stage(x, greedy)
        if staged is None:
            self._last = None
            num_rows = int(x.tokens.shape[0])
            bucket = self._bucket(num_rows) if self.static else None
            if bucket is None:
                tokens, logits = self.eager(x, greedy)
                return tokens, logits, False
            self._copy_in(x, num_rows, GREEDY_INPUTS if greedy else ALL_INPUTS)
            tokens, logits = self.eager(self._view(bucket), greedy)
            return tokens[:num_rows], logits[:num_rows], False
        graph, out_tokens, out_logits = staged
        graph.replay()
        num_rows = int(x.tokens.shape[0])
        return out_tokens[:num_rows].clone(), out_logits[:num_rows].clone(), True

    def step_again(self) -> tuple[Tensor, Tensor] | None:
        """The next decode step of the rows the last replayed graph ran, queued with no host round trip:
        each row is fed the token that step produced (still on the device) one position further on.
        (next tokens, logits) as `step`; None when no graph ran last. The caller vouches that every row
        goes on decoding (a row that finished instead just wastes its share of the step)."""
        if self._last is None:
            return None
        rows, bucket, greedy = self._last
        graph, out_tokens, out_logits = self._graphs[(bucket, greedy)]
        b = self._in
        b.tokens[:rows].copy_(out_tokens[:rows])
        torch._foreach_add_([b.positions[:rows], b.seq_lens[:rows]], 1)  # one launch for both
        graph.replay()
        return out_tokens[:rows].clone(), out_logits[:rows].clone()

    def release(self) -> None:
        """Drop the graphs (and with them their memory pool) and the candidate's forward."""
        self._graphs.clear()
        self._pool = None
        self._last = None
        self.forward = None  # type: ignore[assignment]
