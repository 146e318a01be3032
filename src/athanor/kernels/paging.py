"""The paged KV cache, as the PyTorch paths read it.

Each layer's k_cache, v_cache is a pool of pages [num_pages + 1, Hkv, page_size, D] (any strides with a contiguous D;
page num_pages is scratch). block_table [num_slots, pages_per_seq] int32 maps a sequence's tokens to pages: token p
of slot s is row p % page_size of page block_table[s, p // page_size]. Entries past a sequence's length may name any
page and are only ever read under a mask.

A sequence's keys are a view of the pool only where its pages are consecutive and the layout runs a page's last row
straight into the next page's first (`athanor.model.attention.merges_pages`: token-major storage [pages, page_size, Hkv, D] passed as
`.transpose(1, 2)`); elsewhere they are gathered (`gather_kv`, one copy).
"""

from __future__ import annotations

import torch
from torch import Tensor

from athanor.kernels.dispatch import cdiv
from athanor.model.attention import gather_pages, slot_pages


def gather_kv(cache: Tensor, block_table: Tensor, slots: Tensor, length: int) -> Tensor:
    """Tokens 0 .. length - 1 of the sequences in `slots` [B] ([B, Hkv, length, D]), gathered through the block table:
    the first ceil(length / page_size) pages of each row, so those past a row's own length are read too (mask them).
    length: at most pages_per_seq * page_size."""
    return gather_pages(cache, slot_pages(block_table, slots, length, cache.shape[2]))[:, :, :length]


def page_runs(block_table: Tensor, rows: list[int], lens: list[int], page_size: int) -> list[int | None]:
    """For each sequence (rows: its slot, lens: its length, both on the host), its first page where the pages holding
    its `lens` tokens are consecutive (p, p + 1, ...), else None. Reads the table's rows once (a host sync)."""
    if not rows:
        return []
    index = torch.tensor(rows, device=block_table.device)
    width = max(1, cdiv(max(lens), page_size))
    pages = block_table.index_select(0, index)[:, :width].long()  # [B, P]
    j = torch.arange(pages.shape[1], device=pages.device)
    needed = j[None, :] < torch.tensor([cdiv(n, page_size) for n in lens], device=pages.device)[:, None]
    consecutive = ((pages == pages[:, :1] + j) | ~needed).all(1)
    return [int(p) if ok else None for p, ok in zip(pages[:, 0].tolist(), consecutive.tolist(), strict=True)]


def run_view(cache: Tensor, first_page: int, length: int) -> Tensor:
    """Tokens 0 .. length - 1 of a sequence whose pages run from `first_page` on, as a view [Hkv, length, D] of a pool
    that `athanor.model.attention.merges_pages`."""
    page_size = cache.shape[2]
    tokens = cache.transpose(1, 2)[first_page:first_page + cdiv(length, page_size)].flatten(0, 1)  # [T, Hkv, D]
    return tokens[:length].transpose(0, 1)
