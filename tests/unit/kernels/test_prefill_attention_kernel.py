"""Prefill attention over cached slots against attention written out one query at a time."""

from __future__ import annotations

import pytest
import torch

from athanor.errors import ConfigError
from athanor.kernels import HAS_TRITON, prefill_attention
from athanor.model.reference import PrefillExtent, prefill_extent

triton_only = pytest.mark.skipif(not HAS_TRITON, reason="Triton is not installed")
IMPLS = [pytest.param("triton", marks=triton_only), "torch"]
SMALL_TILES = dict(block_m=16, block_n=16, num_warps=4)  # the interpreter's cost grows with the tile


def _one_query_at_a_time(q, k_cache, v_cache, lens, slots, starts):
    """Query j of sequence b over keys 0..starts[b] + j of its slot, by an explicit softmax."""
    hq, d = q.shape[1], q.shape[2]
    group = hq // k_cache.shape[1]
    rows, t = [], 0
    for n, slot, start in zip(lens, slots, starts):
        for j in range(n):
            keys = k_cache[slot, :, : start + j + 1].repeat_interleave(group, 0)  # [Hq, L, D]
            values = v_cache[slot, :, : start + j + 1].repeat_interleave(group, 0)
            probs = torch.softmax((keys @ q[t + j][:, :, None])[:, :, 0] * d**-0.5, dim=-1)  # [Hq, L]
            rows.append((probs[:, None, :] @ values)[:, 0])
        t += n
    return torch.stack(rows)


def _extent(cu: torch.Tensor, starts: list[int]) -> PrefillExtent:
    return prefill_extent(cu, torch.tensor(starts))


def _batch(gen, lens, starts, hq=4, hkv=2, d=16, max_len=160, num_slots=6):
    q = torch.randn(sum(lens), hq, d, generator=gen)
    k_cache = torch.randn(num_slots, hkv, max_len, d, generator=gen)
    v_cache = torch.randn(num_slots, hkv, max_len, d, generator=gen)
    slots = torch.randperm(num_slots, generator=gen)[: len(lens)].tolist()
    cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()])
    return q, k_cache, v_cache, cu, slots


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize(("hq", "hkv"), [(4, 4), (4, 2), (8, 1)])
def test_fresh_prompts_and_continued_chunks_in_one_batch(gen, impl, hq, hkv):
    # A fresh prompt, a chunk deep into its slot, a one-token chunk, a chunk crossing tiles from an odd start.
    lens, starts = [7, 33, 1, 20], [0, 90, 41, 5]
    q, k_cache, v_cache, cu, slots = _batch(gen, lens, starts, hq, hkv)
    out = prefill_attention(q, k_cache, v_cache, cu, torch.tensor(slots), torch.tensor(starts), _extent(cu, starts), impl,
                            **SMALL_TILES)
    expected = _one_query_at_a_time(q, k_cache, v_cache, lens, slots, starts)
    torch.testing.assert_close(out, expected, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("impl", IMPLS)
def test_a_lone_long_chunk_after_a_cached_prefix(gen, impl):
    lens, starts = [50], [100]
    q, k_cache, v_cache, cu, slots = _batch(gen, lens, starts)
    out = prefill_attention(q, k_cache, v_cache, cu, torch.tensor(slots), torch.tensor(starts), _extent(cu, starts), impl,
                            **SMALL_TILES)
    torch.testing.assert_close(out, _one_query_at_a_time(q, k_cache, v_cache, lens, slots, starts),
                               rtol=1e-4, atol=1e-5)


@triton_only
def test_a_token_major_cache_view_reads_the_same_keys(gen):
    lens, starts = [12, 30], [0, 17]
    q, k_cache, v_cache, cu, slots = _batch(gen, lens, starts)
    token_major = [c.transpose(1, 2).contiguous().transpose(1, 2) for c in (k_cache, v_cache)]
    args = (cu, torch.tensor(slots), torch.tensor(starts), _extent(cu, starts))
    out = prefill_attention(q, *token_major, *args, "triton", block_m=32, block_n=16, num_warps=4)
    torch.testing.assert_close(out, prefill_attention(q, k_cache, v_cache, *args, "torch"), rtol=1e-4, atol=1e-5)


@triton_only
def test_a_tile_size_outside_the_list_is_refused_before_launch(gen):
    q, k_cache, v_cache, cu, slots = _batch(gen, [4], [0])
    with pytest.raises(ConfigError, match="block_n"):
        prefill_attention(q, k_cache, v_cache, cu, torch.tensor(slots), torch.tensor([0]), _extent(cu, [0]),
                          "triton", block_n=48)
