"""Attention as partial softmaxes combined, for the reference forward: each part's output and the log of its softmax
denominator, per query and head, weighed together exactly as one softmax over every key would.

- Decode context parallelism (DCP): the keys and values of every sequence split over `layout.dcp` ranks, token p on
  rank p % dcp at its local position p // dcp, so a long context's KV memory and the attention reading it divide by
  the degree. Every rank holds the whole attention (its q, k and v for every token), attends over its own share
  of the keys, and the shares' parts are all-gathered.
- Attention sinks (gpt-oss): a learned logit per head that joins every query's softmax with no value, so it only
  adds to the denominator."""

from __future__ import annotations

import torch
from torch import Tensor

from athanor.model.attention import gather_pages
from athanor.model.seam import BuildContext


def kv_places(block_table: Tensor, slots: Tensor, positions: Tensor, page_size: int, rank: int, dcp: int,
              scratch_page: int) -> tuple[Tensor, Tensor]:
    """Where this rank writes the key and value of token positions[n] of slot slots[n]: (page [N], row [N]) of its
    local position, or the scratch page for a token another rank holds."""
    local = positions // dcp
    pages = block_table[slots, local // page_size].long()
    return torch.where(positions % dcp == rank, pages, scratch_page), local % page_size


def attend(q: Tensor, q_pos: Tensor, k_cache: Tensor, v_cache: Tensor, block_table: Tensor, slots: Tensor,
           ctx: BuildContext, window: int, scale: float, sinks: Tensor | None = None) -> Tensor:
    """Causal attention of queries q [B, Hq, M, D] at positions q_pos [B, M] of their slots [B] over the keys the
    DCP ranks hold together (with a `window`, only the last `window` of them; with `sinks` [Hq], each head's sink
    logit in its softmax): [B, Hq, M, D]."""
    dcp, rank = ctx.layout.dcp, ctx.rank % ctx.layout.dcp
    page_size = k_cache.shape[2]
    local_len = max((int(q_pos.max()) - rank) // dcp + 1, 1)
    pages = block_table.index_select(0, slots)[:, :-(-local_len // page_size)].long()
    keys = gather_pages(k_cache, pages)[:, :, :local_len]  # [B, Hkv, L, D]
    values = gather_pages(v_cache, pages)[:, :, :local_len]
    key_pos = torch.arange(local_len, device=q.device) * dcp + rank
    mask = key_pos[None, None, :] <= q_pos[:, :, None]  # [B, M, L]
    if window:
        mask &= key_pos[None, None, :] > q_pos[:, :, None] - window
    out, lse = _partial(q, keys, values, mask, scale)
    outs, lses = (ctx.all_gather(out), ctx.all_gather(lse)) if dcp > 1 else (out[None], lse[None])
    return _combine(outs, lses, sinks).to(q.dtype)


def _partial(q: Tensor, keys: Tensor, values: Tensor, mask: Tensor, scale: float) -> tuple[Tensor, Tensor]:
    """Softmax attention over one share of the keys, fp32: the output [B, Hq, M, D] (zero where the share holds no
    key a query sees) and the log of its denominator [B, Hq, M] (-inf there)."""
    b, hq, m, d = q.shape
    hkv = keys.shape[1]
    qg = q.float().view(b, hkv, hq // hkv, m, d)  # query heads sharing one KV head are adjacent
    scores = (qg @ keys.float()[:, :, None].transpose(-1, -2)) * scale  # [B, Hkv, G, M, L]
    scores = scores.masked_fill(~mask[:, None, None], float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)
    probs = torch.exp(scores - torch.where(torch.isfinite(lse), lse, 0.0)[..., None])
    out = probs @ values.float()[:, :, None]  # [B, Hkv, G, M, D]
    return out.reshape(b, hq, m, d), lse.reshape(b, hq, m)


def _combine(outs: Tensor, lses: Tensor, sinks: Tensor | None) -> Tensor:
    """One softmax's output from the shares' [R, B, Hq, M, D] outputs and [R, B, Hq, M] log-denominators, and the
    sinks' [Hq] logits, which add to the denominator only."""
    top = lses.max(dim=0).values  # a query's own key is on some rank: finite
    if sinks is not None:
        top = torch.maximum(top, sinks.float()[None, :, None])
    weights = torch.exp(lses - top)[..., None]
    denominator = weights.sum(0)
    if sinks is not None:
        denominator = denominator + torch.exp(sinks.float()[None, :, None] - top)[..., None]
    return (weights * outs).sum(0) / denominator
