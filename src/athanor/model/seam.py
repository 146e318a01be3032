"""The candidate seam: what the engine hands a forward pass, and what it must give back.

Ownership (docs/architecture.md, "The candidate seam"):
- The engine owns the static input buffers below (on the model's device), padding to
  batch-size buckets, CUDA-graph capture of `decode` and sampling.
- The engine owns the KV memory's *map*: the page size and `ctx.block_table`, which says which
  page of the pool holds each slot's tokens (token p of slot s: page `block_table[s, p // page_size]`,
  row `p % page_size`). It changes the table between calls, never during one.
- The candidate owns the pool itself (`ctx.num_pages + 1` pages of `ctx.page_size` tokens per layer,
  the last one scratch), allocated through `ctx.allocate` so the engine can account for memory, and
  the layout inside a page. Slot `ctx.max_seqs` is the padding rows': its table row is all scratch.

A candidate file defines `build(model, ctx) -> Forward` and declares `SEAM_VERSION = 2`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import torch
from torch import Tensor

from athanor.seams import SEAM_VERSION as SEAM_VERSION
from athanor.seams import pages_for as pages_for


@dataclass(frozen=True)
class Layout:
    """A parallel layout: the reference forward runs TP, EP and DP shards (`athanor.model.shard`) and DCP's split
    KV (`athanor.model.partial_attention`); `athanor plan` ranks them all."""

    tp: int = 1
    """Tensor-parallel degree."""
    ep: int = 1
    """Expert-parallel degree (MoE)."""
    dp: int = 1
    """Data-parallel replicas."""
    pp: int = 1
    """Pipeline stages."""
    dcp: int = 1
    """Decode context-parallel degree (KV split across ranks)."""

    @property
    def gpus(self) -> int:
        """Devices the layout takes (EP and DCP reuse the TP x DP ranks)."""
        return self.tp * self.dp * self.pp

    @property
    def replica_gpus(self) -> int:
        """Devices one replica (one copy of the model, serving its share of the sequences) takes."""
        return self.tp * self.pp

    @property
    def name(self) -> str:
        parts = [f"{k}{v}" for k, v in (("tp", self.tp), ("ep", self.ep), ("dcp", self.dcp), ("pp", self.pp),
                                        ("dp", self.dp)) if v > 1]
        return ".".join(parts) or "tp1"


PAGE_SIZE = 16
"""Tokens a KV page holds unless the engine is told otherwise: small enough that a sequence wastes under a page,
and the unit in which prefixes are shared."""


def identity_block_table(max_seqs: int, max_seq_len: int, page_size: int, device: torch.device | str) -> Tensor:
    """A block table [max_seqs + 1, pages_per_seq] int32 giving every slot (the padding slot too) its own
    consecutive pages for a whole `max_seq_len`: slot s holds pages s * pages_per_seq ... For callers that run a
    forward without an engine (tools, tests); it needs `(max_seqs + 1) * pages_per_seq` pages."""
    per_seq = pages_for(max_seq_len, page_size)
    return torch.arange((max_seqs + 1) * per_seq, dtype=torch.int32, device=device).view(max_seqs + 1, per_seq)


@dataclass
class BuildContext:
    """What `build(model, ctx)` may use besides the weights."""

    device: torch.device
    dtype: torch.dtype
    max_seqs: int
    """Number of real slots; slot `max_seqs` is the padding slot, so the block table has `max_seqs + 1` rows."""
    max_seq_len: int
    """Longest sequence (prompt + generated tokens) a slot can hold."""
    page_size: int = PAGE_SIZE
    """Tokens per KV page."""
    num_pages: int = 0
    """Pages in the pool, scratch not counted (the pool has `num_pages + 1`: page `num_pages` is scratch, where
    the padding slot's rows and unused table entries point). 0: enough for every slot to hold `max_seq_len`
    tokens, under `identity_block_table`."""
    block_table: Tensor | None = None
    """[max_seqs + 1, pages_per_seq] int32 on `device`, the engine's (None: `identity_block_table`). Candidates read
    it at every call (the engine rewrites it in place between calls) and never write it."""
    rank: int = 0
    world_size: int = 1
    group: Any = None
    """The torch.distributed process group of this engine, or None on one device."""
    layout: Layout = field(default_factory=Layout)
    scratch_dir: Path | None = None
    """The only directory a candidate may write to."""
    allocated_bytes: int = 0
    """Bytes handed out by `allocate` so far (the engine reads it for memory accounting)."""

    def __post_init__(self) -> None:
        if self.block_table is None:
            self.block_table = identity_block_table(self.max_seqs, self.max_seq_len, self.page_size, self.device)
            self.num_pages = self.num_pages or int(self.block_table.numel())

    @property
    def pages_per_seq(self) -> int:
        """Entries of a block-table row: the pages a `max_seq_len` sequence spans."""
        return pages_for(self.max_seq_len, self.page_size)

    @property
    def table(self) -> Tensor:
        """`block_table`, typed as set (`__post_init__` fills it)."""
        assert self.block_table is not None
        return self.block_table

    def allocate(self, shape: tuple[int, ...], dtype: torch.dtype | None = None) -> Tensor:
        """A zeroed state tensor on the engine's device, counted against this candidate."""
        out = torch.zeros(shape, dtype=dtype or self.dtype, device=self.device)
        self.allocated_bytes += out.numel() * out.element_size()
        return out

    def all_reduce(self, t: Tensor) -> Tensor:
        """`t` summed in place over this engine's ranks (tensor parallelism's partial sums); `t` itself on one."""
        if self.world_size > 1:
            import torch.distributed as dist

            dist.all_reduce(t, group=self.group)
        return t

    def all_gather(self, t: Tensor) -> Tensor:
        """Every rank's `t`, stacked in rank order: [world_size, *t.shape] (`t[None]` on one device)."""
        if self.world_size == 1:
            return t[None]
        import torch.distributed as dist

        parts = [torch.empty_like(t) for _ in range(self.world_size)]
        dist.all_gather(parts, t.contiguous(), group=self.group)
        return torch.stack(parts)


@dataclass
class DecodeBatch:
    """One decode step: one new token per sequence.

    tokens:    [B] int64  the token to feed
    positions: [B] int64  its position (== seq_lens for a plain decode)
    slots:     [B] int64  which slot (block-table row) each row belongs to (padding rows use slot `max_seqs`)
    seq_lens:  [B] int64  tokens already cached in each slot before this step
    """

    tokens: Tensor
    positions: Tensor
    slots: Tensor
    seq_lens: Tensor

    @property
    def num_seqs(self) -> int:
        return int(self.tokens.shape[0])


@dataclass
class PrefillBatch:
    """A packed prefill of several sequences, each possibly continuing its cached slot.

    tokens:     [T] int64    all new tokens, sequence after sequence
    cu_seqlens: [B+1] int64  offsets of each sequence in `tokens` (cu_seqlens[0] == 0)
    positions:  [T] int64    position of each token (seq_lens[b] + i for the i-th new token)
    slots:      [B] int64
    seq_lens:   [B] int64    tokens already cached per slot (0 for a fresh prompt)
    """

    tokens: Tensor
    cu_seqlens: Tensor
    positions: Tensor
    slots: Tensor
    seq_lens: Tensor

    @property
    def num_seqs(self) -> int:
        return int(self.slots.shape[0])


@runtime_checkable
class Forward(Protocol):
    """What a candidate's `build` returns."""

    graph_safe: bool
    """True when `decode` may be captured in a CUDA graph (no host syncs, static shapes)."""

    def prefill(self, batch: PrefillBatch) -> Tensor:
        """Logits [num_seqs, vocab] of each sequence's last new token; fills the slots' KV state."""
        ...

    def decode(self, batch: DecodeBatch) -> Tensor:
        """Logits [num_seqs, vocab] of the next token; writes each row's new key and value into its slot's pages."""
        ...

    # Optional: `decode_greedy(batch) -> (tokens [num_seqs] int64, logits)`, what `decode` does plus each row's
    # argmax (the first maximum of its logits), for a forward that makes the tokens more cheaply than the engine's
    # argmax after it (e.g. inside its LM head). The engine then calls it for the steps whose rows are all greedy,
    # and the evaluator checks on every run that the tokens are the argmax of the logits returned with them.
    # Optional: `static_shapes = True`, for a decode compiled for fixed shapes (torch.compile, dynamic=False): the
    # engine then pads every decode step to its batch bucket even where it captures no graph, and runs each bucket
    # once when the candidate is swapped in, so no compile falls inside a step that is served or timed.


def make_prefill_batch(
    prompts: list[list[int]], slots: list[int], seq_lens: list[int] | None = None, device: torch.device | str = "cpu"
) -> PrefillBatch:
    """Pack token lists into a `PrefillBatch` (a convenience for callers outside the engine)."""
    starts = seq_lens or [0] * len(prompts)
    tokens = [t for p in prompts for t in p]
    cu = [0]
    positions: list[int] = []
    for p, start in zip(prompts, starts):
        cu.append(cu[-1] + len(p))
        positions.extend(range(start, start + len(p)))
    as_long = dict(dtype=torch.long, device=device)
    return PrefillBatch(
        tokens=torch.tensor(tokens, **as_long),  # type: ignore[arg-type]
        cu_seqlens=torch.tensor(cu, **as_long),  # type: ignore[arg-type]
        positions=torch.tensor(positions, **as_long),  # type: ignore[arg-type]
        slots=torch.tensor(slots, **as_long),  # type: ignore[arg-type]
        seq_lens=torch.tensor(starts, **as_long),  # type: ignore[arg-type]
    )
