"""The engine's side of the paged KV pool: each resident's block table, and how many pages its pool has.

A resident's table is [max_seqs + 1, pages_per_seq] int32 on the engine's device (`athanor.model.seam`). Two
ways to fill it:
- static (`EngineConfig.kv_pages == 0`, the evaluator's engines and the in-engine tools): every slot owns pages
  for a whole `max_seq_len`, dealt from a shuffled pool, so no slot's pages are consecutive and a forward that
  reads the pool as if they were computes wrong keys — which the evaluator's comparison catches;
- dynamic (`kv_pages > 0`, the server): a pool sized by the caller, the table all scratch at first, and the
  server's scheduler writing pages into it as sequences grow (`write_pages`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch import Tensor

from athanor.engine.config import EngineConfig
from athanor.seams import pages_for


def pages_per_seq(cfg: EngineConfig) -> int:
    return pages_for(cfg.max_seq_len, cfg.page_size)


def block_table(cfg: EngineConfig, device: torch.device) -> tuple[int, Tensor]:
    """(pages in the pool, scratch not counted; the block table) of a new resident under `cfg`."""
    rows, per_seq = cfg.max_seqs + 1, pages_per_seq(cfg)
    if cfg.kv_pages > 0:
        return cfg.kv_pages, torch.full((rows, per_seq), cfg.kv_pages, dtype=torch.int32, device=device)
    num_pages = cfg.max_seqs * per_seq
    table = torch.full((rows, per_seq), num_pages, dtype=torch.int32, device=device)  # the padding slot: all scratch
    deal(table, num_pages, cfg.seed)
    return num_pages, table


def deal(table: Tensor, num_pages: int, seed: int) -> None:
    """Give every real slot of a static table (all rows but the padding slot's) its own pages, in an order shuffled
    by `seed`, in place. Dealt again before each of the evaluator's trajectories, it poisons the pool: whatever a
    candidate left in its pages now sits under other slots and positions, so a forward that skips a write or reads
    keys it did not write this trajectory computes wrong logits."""
    dealt = torch.randperm(num_pages, generator=torch.Generator().manual_seed(seed)).to(torch.int32)
    table[:-1].copy_(dealt.view(table.shape[0] - 1, table.shape[1]))


@contextlib.contextmanager
def shared_prefix(table: Tensor, shared: Tensor | None) -> Iterator[None]:
    """While the block holds: `shared` = (source, slot, n) points the slot's first n table entries at the source
    slot's pages (`ScriptStep.shared`); the slot's own entries come back after."""
    if shared is None:
        yield
        return
    source, slot, n = (int(v) for v in shared.tolist())
    own = table[slot, :n].clone()
    table[slot, :n] = table[source, :n]
    try:
        yield
    finally:
        table[slot, :n] = own


def check_shared(shared: Tensor | None, slots: list[int], starts: list[int], cfg: EngineConfig) -> str:
    """Why a step's `shared` prefix is not one this engine can lend ("" when it can): a static table, slots in
    range, and the slot's step writing only past the borrowed pages (a write there would land in the source's)."""
    if shared is None:
        return ""
    if cfg.kv_pages or shared.numel() != 3:
        return "a shared prefix needs a static block table and (source slot, slot, pages)"
    source, slot, n = (int(v) for v in shared.tolist())
    if not (0 <= source < cfg.max_seqs and 0 <= slot < cfg.max_seqs and source != slot
            and 0 < n <= pages_per_seq(cfg)):
        return f"shared prefix {(source, slot, n)}: slots must be two of 0..{cfg.max_seqs - 1}, pages 1.." \
               f"{pages_per_seq(cfg)}"
    if any(s == slot and start < n * cfg.page_size for s, start in zip(slots, starts, strict=True)):
        return f"shared prefix: slot {slot}'s step starts inside the {n} pages it borrows"
    return ""


def write_pages(table: Tensor, updates: list[tuple[int, int, int]]) -> None:
    """Apply (slot, index in its row, page) writes to a block table on its device: one copy and one scatter, in
    stream order (a step queued before sees the table as it was)."""
    if not updates:
        return
    host = torch.tensor(updates, dtype=torch.long)
    if table.is_cuda:  # pinned, so the copy is queued behind a step in flight instead of waiting for it
        host = host.pin_memory()
    rows, cols, pages = host.to(table.device, non_blocking=True).T
    table.index_put_((rows, cols), pages.to(table.dtype))
