"""Prefill attention over a paged KV pool against attention written out one query at a time over unpaged keys."""

from __future__ import annotations

import pytest
import torch

from athanor.errors import ConfigError
from athanor.kernels import HAS_TRITON, prefill_attention
from athanor.model.attention import PrefillExtent, prefill_extent

triton_only = pytest.mark.skipif(not HAS_TRITON, reason="Triton is not installed")
IMPLS = [pytest.param("triton", marks=triton_only), "torch"]
SMALL_TILES = dict(block_m=16, block_n=16, num_warps=4)  # the interpreter's cost grows with the tile


def _one_query_at_a_time(q, dense, lens, slots, starts):
    """Query j of sequence b over keys 0..starts[b] + j of its slot's unpaged keys, `dense` = (k, v) each
    [slots, Hkv, L, D], by an explicit softmax."""
    k_dense, v_dense = dense
    hq, d = q.shape[1], q.shape[2]
    group = hq // k_dense.shape[1]
    rows, t = [], 0
    for n, slot, start in zip(lens, slots, starts):
        for j in range(n):
            keys = k_dense[slot, :, : start + j + 1].repeat_interleave(group, 0)  # [Hq, L, D]
            values = v_dense[slot, :, : start + j + 1].repeat_interleave(group, 0)
            probs = torch.softmax((keys @ q[t + j][:, :, None])[:, :, 0] * d**-0.5, dim=-1)  # [Hq, L]
            rows.append((probs[:, None, :] @ values)[:, 0])
        t += n
    return torch.stack(rows)


def _poison(impl: str) -> float:
    """What fills the pool where no sequence's keys are: NaN for the kernel, which must never read there unmasked;
    finite garbage for the torch fallback, which gathers every slot's pages up to the longest sequence and masks
    the scores (a masked NaN value would still poison its matmul, and the engine's pool starts zeroed)."""
    return float("nan") if impl == "triton" else 1e3


def _page(gen, dense, lens, slots, starts, page_size, table=None, token_major=False, poison=float("nan")):
    """`dense` [slots, Hkv, max_len, D] as a pool [num_pages + 1, Hkv, page_size, D] and its block table.

    Every slot's pages are dealt from a shuffled pool (pass `table` to deal a second pool alike). The batch's
    slots keep only the pages up to their sequence's end: the rest of their rows point at the scratch page (the
    last); scratch and the rows of a page past its sequence's end hold `poison`."""
    num_slots, hkv, max_len, d = dense.shape
    per_seq = -(-max_len // page_size)
    num_pages = num_slots * per_seq
    poisoned = torch.full((num_slots, hkv, per_seq * page_size, d), poison)
    poisoned[:, :, :max_len] = dense
    if table is None:
        table = torch.randperm(num_pages, generator=gen).to(torch.int32).view(num_slots, per_seq)
        for n, slot, start in zip(lens, slots, starts):
            table[slot, -(-(start + n) // page_size):] = num_pages
    for n, slot, start in zip(lens, slots, starts):
        poisoned[slot, :, start + n:] = poison
    pool = torch.full((num_pages + 1, hkv, page_size, d), poison)
    pages = poisoned.view(num_slots, hkv, per_seq, page_size, d).transpose(1, 2)  # [slots, per_seq, Hkv, P, D]
    live = table != num_pages
    pool[table[live].long()] = pages[live]
    if token_major:  # storage [num_pages + 1, page_size, Hkv, D]
        pool = pool.transpose(1, 2).contiguous().transpose(1, 2)
    return pool, table


def _extent(cu: torch.Tensor, starts: list[int]) -> PrefillExtent:
    return prefill_extent(cu, torch.tensor(starts))


def _batch(gen, lens, starts, hq=4, hkv=2, d=16, max_len=160, num_slots=6, page_size=16, token_major=False,
           impl="triton"):
    """Queries, the paged (k, v) pools and their block table, cu_seqlens, the slots, and the unpaged keys."""
    q = torch.randn(sum(lens), hq, d, generator=gen)
    k_dense = torch.randn(num_slots, hkv, max_len, d, generator=gen)
    v_dense = torch.randn(num_slots, hkv, max_len, d, generator=gen)
    slots = torch.randperm(num_slots, generator=gen)[: len(lens)].tolist()
    cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()])
    paging = dict(token_major=token_major, poison=_poison(impl))
    k_pool, table = _page(gen, k_dense, lens, slots, starts, page_size, **paging)
    v_pool, _ = _page(gen, v_dense, lens, slots, starts, page_size, table, **paging)
    return q, (k_pool, v_pool, table), cu, slots, (k_dense, v_dense)


def _attend(q, pools, cu, slots, starts, impl, **tiles):
    k_pool, v_pool, table = pools
    return prefill_attention(q, k_pool, v_pool, cu, torch.tensor(slots), table, torch.tensor(starts),
                             _extent(cu, starts), impl, **tiles)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize(("hq", "hkv"), [(4, 4), (4, 2), (8, 1)])
def test_fresh_prompts_and_continued_chunks_in_one_batch(gen, impl, hq, hkv):
    # A fresh prompt, a chunk deep into its slot ending mid-page, a one-token chunk, a chunk crossing tiles from an
    # odd start.
    lens, starts = [7, 33, 1, 20], [0, 90, 41, 5]
    q, pools, cu, slots, dense = _batch(gen, lens, starts, hq, hkv, impl=impl)
    out = _attend(q, pools, cu, slots, starts, impl, **SMALL_TILES)
    torch.testing.assert_close(out, _one_query_at_a_time(q, dense, lens, slots, starts), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("token_major", [False, True], ids=["head_major", "token_major"])
@pytest.mark.parametrize("page_size", [4, 8, 16, 64])
def test_any_page_size_against_the_tile_in_either_layout(gen, impl, token_major, page_size):
    # Pages smaller than, as wide as and wider than the 16-key tile; chunks that end mid-page.
    lens, starts = [5, 21, 1], [0, 37, 12]
    q, pools, cu, slots, dense = _batch(gen, lens, starts, max_len=96, page_size=page_size, token_major=token_major,
                                        impl=impl)
    out = _attend(q, pools, cu, slots, starts, impl, **SMALL_TILES)
    torch.testing.assert_close(out, _one_query_at_a_time(q, dense, lens, slots, starts), rtol=1e-4, atol=1e-5)


@triton_only
@pytest.mark.parametrize(("page_size", "block_m", "block_n"), [(4, 16, 32), (16, 32, 16), (32, 16, 32)])
def test_other_tiles_over_pages(gen, page_size, block_m, block_n):
    lens, starts = [19, 3], [13, 30]
    q, pools, cu, slots, dense = _batch(gen, lens, starts, max_len=64, page_size=page_size, token_major=True)
    out = _attend(q, pools, cu, slots, starts, "triton", block_m=block_m, block_n=block_n, num_warps=4)
    torch.testing.assert_close(out, _one_query_at_a_time(q, dense, lens, slots, starts), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("impl", IMPLS)
def test_a_lone_long_chunk_after_a_cached_prefix(gen, impl):
    lens, starts = [50], [100]
    q, pools, cu, slots, dense = _batch(gen, lens, starts, impl=impl)
    out = _attend(q, pools, cu, slots, starts, impl, **SMALL_TILES)
    torch.testing.assert_close(out, _one_query_at_a_time(q, dense, lens, slots, starts), rtol=1e-4, atol=1e-5)


@triton_only
def test_a_tile_size_outside_the_list_is_refused_before_launch(gen):
    q, pools, cu, slots, _ = _batch(gen, [4], [0])
    with pytest.raises(ConfigError, match="block_n"):
        _attend(q, pools, cu, slots, [0], "triton", block_n=48)
