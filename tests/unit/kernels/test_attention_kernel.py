"""Split-KV decode attention against the reference's decode_attention over the unpaged keys.

Every cache here is paged as the engine pages it (`kernels.paging`): the keys of fresh random dense caches
[slots, Hkv, max_len, D] copied onto pages of a pool, shuffled unless a test says otherwise, in a head-major or a
token-major layout, with page sizes that do and do not divide the kernel's tiles and contexts that end mid-page."""

from __future__ import annotations

import pytest
import torch

from athanor.errors import ConfigError
from athanor.kernels import (
    HAS_TRITON,
    decode_attention,
    decode_attention_flex,
    decode_attention_per_seq,
    num_kv_splits,
)
from athanor.kernels.per_seq_attention import batch_views, row_runs
from athanor.model import reference

triton_only = pytest.mark.skipif(not HAS_TRITON, reason="Triton is not installed")
IMPLS = [pytest.param("triton", marks=triton_only), "torch"]


def paged(gen, dense, page_size, token_major=False, order="shuffled", fill=None, lens=None):
    """Pools [pages + 1, Hkv, page_size, D] holding the dense caches `dense` (keys, values: [S, Hkv, L, D]) on pages,
    and the block table [S, ceil(L / page_size)] int32 naming them. order: "shuffled" (a random permutation of a pool
    with spare pages), "consecutive" (slot s's pages from 1 + s * pages_per_seq on) or "runs" (each slot's pages
    consecutive, the slots' runs shuffled). Spare pages, the scratch (the last) and the rows past L hold `fill` (None:
    random values). `lens` [S]: each slot's table entries past its length name the scratch page instead."""
    s, hkv, length, d = dense[0].shape
    per_seq = -(-length // page_size)
    num_pages = s * per_seq + 3
    if order == "shuffled":
        table = torch.randperm(num_pages, generator=gen)[:s * per_seq].view(s, per_seq)
    elif order == "consecutive":
        table = 1 + torch.arange(s * per_seq).view(s, per_seq)
    else:
        table = torch.randperm(s, generator=gen)[:, None] * per_seq + torch.arange(per_seq)
    pools = []
    for cache in dense:
        shape = (num_pages + 1, page_size, hkv, d) if token_major else (num_pages + 1, hkv, page_size, d)
        pool = torch.randn(shape, generator=gen) if fill is None else torch.full(shape, fill)
        pool = pool.to(cache.dtype).transpose(1, 2) if token_major else pool.to(cache.dtype)
        padded = pool.new_full((s, hkv, per_seq * page_size, d), fill if fill is not None else 0.0)
        padded[:, :, :length] = cache
        pool[table.flatten()] = padded.view(s, hkv, per_seq, page_size, d).transpose(1, 2).flatten(0, 1)
        pools.append(pool)
    if lens is not None:
        table[torch.arange(per_seq)[None, :] >= (lens[:, None] + page_size - 1) // page_size] = num_pages
    return pools, table.int()


def unpaged(pool, table):
    """The dense cache [S, Hkv, pages_per_seq * page_size, D] a pool and its block table hold (page by page)."""
    return torch.stack([torch.cat([pool[p] for p in row], dim=1) for row in table.tolist()])


def expected(q, k_cache, v_cache, slots, kv_lens):
    """reference.decode_attention over the dense caches' rows `slots`, masked to each row's length."""
    kv_len = int(kv_lens.max())
    keys = k_cache[:, :, :kv_len].index_select(0, slots)
    values = v_cache[:, :, :kv_len].index_select(0, slots)
    mask = torch.arange(kv_len)[None, :] < kv_lens[:, None]
    return reference.decode_attention(q, keys, values, mask).view(q.shape)


def dense_caches(gen, num_slots, hkv, max_len, d, dtype=torch.float32):
    return [torch.randn(num_slots, hkv, max_len, d, generator=gen).to(dtype) for _ in range(2)]


def lens_of(slots, kv_lens, num_slots):
    """Each slot's length [num_slots]: kv_lens at the rows' slots, 1 elsewhere."""
    lens = torch.ones(num_slots, dtype=torch.long)
    lens[slots] = kv_lens
    return lens


def nan_fill(impl):
    """What the Triton path's pools hold outside the live keys: NaN, which any unmasked read would spread. The PyTorch
    path reads past a row's length (masked; gathered up to the longest row) and so gets finite values there."""
    return float("nan") if impl == "triton" else None


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize(("hq", "hkv"), [(4, 4), (4, 2), (8, 1)])
@pytest.mark.parametrize(("num_splits", "page_size"), [(None, 16), (1, 4), (3, 8)])
def test_decode_attention_gqa_and_splits(gen, impl, hq, hkv, num_splits, page_size):
    b, d, max_len, slots_n = 3, 16, 200, 5
    q = torch.randn(b, hq, d, generator=gen)
    dense = dense_caches(gen, slots_n, hkv, max_len, d)
    slots = torch.randperm(slots_n, generator=gen)[:b]
    kv_lens = torch.tensor([1, int(torch.randint(2, 70, (1,), generator=gen)), 200])  # 1 key, one tile+, full
    (k_cache, v_cache), table = paged(gen, dense, page_size, fill=nan_fill(impl), lens=lens_of(slots, kv_lens, slots_n))
    out = decode_attention(q, k_cache, v_cache, slots, table, kv_lens, num_splits=num_splits, impl=impl)
    torch.testing.assert_close(out, expected(q, *dense, slots, kv_lens), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("page_size", [1, 12])  # a page a key; a page that neither divides a tile nor is a power of 2
def test_decode_attention_at_any_page_size(gen, impl, page_size):
    b, hq, hkv, d, max_len = 2, 4, 2, 16, 40
    q = torch.randn(b, hq, d, generator=gen)
    dense = dense_caches(gen, 3, hkv, max_len, d)
    slots, kv_lens = torch.tensor([2, 0]), torch.tensor([40, 13])
    (k_cache, v_cache), table = paged(gen, dense, page_size, fill=nan_fill(impl), lens=lens_of(slots, kv_lens, 3))
    out = decode_attention(q, k_cache, v_cache, slots, table, kv_lens, num_splits=2, impl=impl)
    torch.testing.assert_close(out, expected(q, *dense, slots, kv_lens), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("impl", IMPLS)
def test_decode_attention_on_a_token_major_view(gen, impl):
    b, hq, hkv, d, max_len = 2, 4, 2, 16, 96
    q = torch.randn(b, hq, d, generator=gen)
    dense = dense_caches(gen, 3, hkv, max_len, d)
    slots, kv_lens = torch.tensor([2, 0]), torch.tensor([96, 37])
    (k_cache, v_cache), table = paged(gen, dense, 8, token_major=True, fill=nan_fill(impl),
                                      lens=lens_of(slots, kv_lens, 3))
    assert k_cache.stride(0) == 8 * k_cache.stride(2)  # pages run into each other
    out = decode_attention(q, k_cache, v_cache, slots, table, kv_lens, impl=impl)
    torch.testing.assert_close(out, expected(q, *dense, slots, kv_lens), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("token_major", [False, True])
def test_static_torch_path_equals_the_eager_one(gen, token_major):
    """Static: every row over all its pages (the scratch's too), masked; eager: up to the longest row."""
    q = torch.randn(2, 4, 16, generator=gen)
    dense = dense_caches(gen, 3, 2, 64, 16)
    slots, kv_lens = torch.tensor([0, 2]), torch.tensor([5, 17])
    (k_cache, v_cache), table = paged(gen, dense, 8, token_major, lens=lens_of(slots, kv_lens, 3))
    static = decode_attention(q, k_cache, v_cache, slots, table, kv_lens, static=True, impl="torch")
    torch.testing.assert_close(static, decode_attention(q, k_cache, v_cache, slots, table, kv_lens, impl="torch"),
                               rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(static, expected(q, *dense, slots, kv_lens), rtol=1e-4, atol=1e-5)


def test_num_kv_splits_is_static_and_bounded():
    cpu = torch.device("cpu")
    assert num_kv_splits(1, 8, 32768, cpu) == 4  # 4 programs per "SM" (8 on CPU) over 8 heads
    assert num_kv_splits(128, 8, 32768, cpu) == 1
    assert num_kv_splits(1, 1, 100, cpu) == 4  # never more splits than tiles (32 keys: 2 of 64 leave SMs idle)
    assert num_kv_splits(4, 2, 100, cpu) == 2  # 16 programs of 64 keys for 8 SMs: 64-key tiles


@pytest.mark.parametrize("attend", [decode_attention_per_seq, decode_attention_flex], ids=["per_seq", "flex"])
@pytest.mark.parametrize(("slots", "kv_lens", "order", "token_major", "batched"), [
    # consecutive slots and pages, similar lengths, token-major: the batched view path
    ([2, 3, 4, 5], [90, 100, 96, 100], "consecutive", True, True),
    ([2, 3, 4, 5], [90, 100, 96, 100], "consecutive", False, False),  # head-major: every row gathered
    ([2, 3, 4, 5], [90, 100, 96, 100], "runs", True, False),  # each row's pages a run, the runs shuffled: row views
    ([2, 3, 4, 5], [90, 100, 96, 100], "shuffled", True, False),  # every row gathered
    ([2, 3, 4, 5], [5, 10, 96, 100], "consecutive", True, False),  # short rows would waste keys: one row at a time
    ([5, 1, 3, 0], [90, 100, 96, 100], "consecutive", True, False),  # slots out of order: one row at a time
    ([4, 5, 6], [128, 1, 127], "consecutive", True, False),  # a one-key row and the cache's last key
    ([0, 1], [40, 40], "consecutive", True, True),  # 8 keys modulo 16: what torch 2.13's flex got wrong at 16-wide
    ([0, 1], [40, 40], "shuffled", False, False),
])
def test_per_seq_attention_paths_agree(gen, attend, slots, kv_lens, order, token_major, batched):
    hq, hkv, d, max_len, num_slots = 6, 3, 32, 128, 7
    q = torch.randn(len(slots), hq, d, generator=gen)
    dense = dense_caches(gen, num_slots, hkv, max_len, d)
    s, n = torch.tensor(slots), torch.tensor(kv_lens)
    (k_cache, v_cache), table = paged(gen, dense, 16, token_major, order, lens=lens_of(s, n, num_slots))
    firsts = row_runs(k_cache, v_cache, table, slots, kv_lens)
    assert (batch_views(k_cache, v_cache, firsts, kv_lens) is not None) == batched
    out = attend(q, k_cache, v_cache, s, table, n)
    torch.testing.assert_close(out, expected(q, *dense, s, n), rtol=1e-4, atol=1e-5)


def test_batch_views_follow_the_table_not_the_slots(gen):
    """Rows whose pages sit a fixed number of pages apart (here 3, a row's full run of pages being 8) are one
    strided view, whatever their slots; a row whose pages stop being consecutive past its length (entries never
    read) still is."""
    dense = dense_caches(gen, 3, 2, 128, 16)
    (k_cache, v_cache), table = paged(gen, dense, 16, token_major=True)
    lens = [40, 48, 33]
    table[2, :] = 1 + 2 * 3 + torch.arange(8, dtype=torch.int32)
    table[0, :] = 1 + torch.arange(8, dtype=torch.int32)
    table[1, :] = 1 + 3 + torch.arange(8, dtype=torch.int32)
    table[1, 3:] = 0  # past its 48 keys (3 pages)
    views = batch_views(k_cache, v_cache, row_runs(k_cache, v_cache, table, [0, 1, 2], lens), lens)
    assert views is not None
    for row, n in enumerate(lens):
        first = int(table[row, 0])
        keys = torch.cat([k_cache[first + i] for i in range(3)], dim=1)[:, :n]
        assert torch.equal(views[0][row, :, :n], keys)
        assert views[0].data_ptr() == k_cache[1].data_ptr()  # a view, no copy


def test_flex_attention_leaves_narrow_heads_to_the_per_row_path(gen, monkeypatch):
    """16-wide heads never reach the compiled flex attention (wrong at some lengths, see flex_decode)."""
    from athanor.kernels import flex_decode

    monkeypatch.setattr(flex_decode, "_compiled", lambda: pytest.fail("flex attention ran on 16-wide heads"))
    q = torch.randn(2, 6, 16, generator=gen)
    dense = dense_caches(gen, 3, 3, 64, 16)
    (k_cache, v_cache), table = paged(gen, dense, 16, token_major=True, order="consecutive")
    s, n = torch.tensor([0, 1]), torch.tensor([40, 40])
    out = flex_decode.decode_attention_flex(q, k_cache, v_cache, s, table, n)
    torch.testing.assert_close(out, expected(q, *dense, s, n), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize(("hq", "hkv", "num_splits", "qk_norm", "d", "page_size", "token_major"),
                         [(4, 2, None, False, 16, 16, False), (8, 1, 3, True, 16, 4, True),
                          (4, 4, 1, True, 16, 8, False),
                          (8, 1, 6, False, 128, 16, True)])  # the merge in chunks of 4 splits ([8, 4, 128] tiles)
def test_rope_cache_attention_is_rope_and_cache_then_attention(gen, impl, hq, hkv, num_splits, qk_norm, d, page_size,
                                                                token_major):
    """The fused kernel against its two steps: the same output, and the same pools afterwards (the new token's
    rotated k and its v written at its page and row, nothing else touched)."""
    from athanor.kernels import KVWrite, rope_and_cache, rope_cache_attention

    b, max_len, slots_n = 3, 200, 5
    qkv = torch.randn(b, hq + 2 * hkv, d, generator=gen)  # q, k, v as views of one fused projection
    q, k, v = qkv[:, :hq], qkv[:, hq:hq + hkv], qkv[:, hq + hkv:]
    cos, sin = torch.randn(max_len, d, generator=gen), torch.randn(max_len, d, generator=gen)
    norms = (torch.randn(d, generator=gen), torch.randn(d, generator=gen)) if qk_norm else (None, None)
    slots = torch.randperm(slots_n, generator=gen)[:b]
    positions = torch.tensor([0, int(torch.randint(1, 70, (1,), generator=gen)), max_len - 1])
    kv_lens = positions + 1
    dense = dense_caches(gen, slots_n, hkv, max_len, d)
    pools, table = paged(gen, dense, page_size, token_major, lens=lens_of(slots, kv_lens, slots_n))
    expected_k, expected_v = (pool.clone() for pool in pools)
    rq = rope_and_cache(q, k, v, cos, sin, positions, slots, table, expected_k, expected_v, impl="torch",
                        q_norm=norms[0], k_norm=norms[1], eps=1e-6)
    want = expected(rq, unpaged(expected_k, table), unpaged(expected_v, table), slots, kv_lens)
    for _ in range(2):  # twice: the split tickets are reset for the next launch
        k_cache, v_cache = (pool.clone() for pool in pools)
        kv = KVWrite(cos, sin, positions, slots, table, k_cache, v_cache, *norms)
        out = rope_cache_attention(q, k, v, kv, kv_lens, 1e-6, num_splits=num_splits, impl=impl)
        torch.testing.assert_close(out, want, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(k_cache, expected_k, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(v_cache, expected_v)


@pytest.mark.parametrize("impl", IMPLS)
def test_lens_offset_attends_one_key_more_per_row(gen, impl):
    """A decode step passes its positions with lens_offset=1: the same as passing positions + 1."""
    q = torch.randn(3, 4, 16, generator=gen)
    (k_cache, v_cache), table = paged(gen, dense_caches(gen, 4, 2, 80, 16), 8)
    slots, positions = torch.tensor([3, 0, 1]), torch.tensor([0, 41, 79])
    torch.testing.assert_close(
        decode_attention(q, k_cache, v_cache, slots, table, positions, impl=impl, lens_offset=1),
        decode_attention(q, k_cache, v_cache, slots, table, positions + 1, impl=impl), rtol=0, atol=0)


@triton_only
@pytest.mark.parametrize(("num_splits", "page_size"), [(None, 16), (1, 64), (3, 8), (8, 64)])
def test_early_keys_attends_the_same_bits(gen, num_splits, page_size):
    """early_keys (the split's first tile loaded before the PDL wait, the newest key re-read after it) peels the
    first tile off the loop: the same sums in the same order, for rows of one key, of splits with no keys (8 splits
    of 2 keys), of one tile and of several tiles a split (BLOCK_N 64; 200 keys in one split), with pages narrower
    than a tile and pages holding whole tiles."""
    q = torch.randn(4, 4, 16, generator=gen)
    dense = dense_caches(gen, 5, 2, 200, 16)
    slots, kv_lens = torch.tensor([3, 0, 1, 4]), torch.tensor([1, 2, 70, 200])
    (k_cache, v_cache), table = paged(gen, dense, page_size, fill=float("nan"), lens=lens_of(slots, kv_lens, 5))
    out = decode_attention(q, k_cache, v_cache, slots, table, kv_lens, num_splits=num_splits, impl="triton",
                           early_keys=True)
    assert torch.equal(out, decode_attention(q, k_cache, v_cache, slots, table, kv_lens, num_splits=num_splits,
                                             impl="triton"))
    torch.testing.assert_close(out, expected(q, *dense, slots, kv_lens), rtol=1e-4, atol=1e-5)


@triton_only
@pytest.mark.parametrize("param", ["split_warps", "merge_warps"])
def test_split_and_merge_warps_parameters(gen, param):
    """The split and merge kernels' warps give the same bits at 1 and 4 (on the interpreter: the plumbing), and a
    value not offered fails with an error naming the parameter."""
    q = torch.randn(2, 4, 16, generator=gen)
    (k_cache, v_cache), table = paged(gen, dense_caches(gen, 3, 2, 90, 16), 16)
    slots, kv_lens = torch.tensor([2, 0]), torch.tensor([5, 90])
    args = (q, k_cache, v_cache, slots, table, kv_lens)
    four = decode_attention(*args, num_splits=3, impl="triton", **{param: 4})
    assert torch.equal(four, decode_attention(*args, num_splits=3, impl="triton", **{param: 1}))
    with pytest.raises(ConfigError, match=param):
        decode_attention(*args, num_splits=3, impl="triton", **{param: 8})


@triton_only
@pytest.mark.parametrize("page_size", [8, 16, 32])  # tiles of 16 keys span two pages, fill one, share one
def test_kv_block_parameter_sets_the_tiles_and_the_splits(gen, page_size):
    """kv_block: 16-key tiles give a 90-key cache more splits (`num_kv_splits`) and the same attention up to the
    merge's rounding, for rows of one tile and of several; a value not offered fails naming the parameter. Unset,
    the tiles are halved (32 keys) only where 64 would give fewer split programs than SMs (8 on the CPU)."""
    from athanor.kernels import num_kv_splits

    cpu = torch.device("cpu")
    assert num_kv_splits(1, 1, 200, cpu) == 7  # 4 programs of 64 keys for 8 SMs: 32-key tiles
    assert num_kv_splits(2, 2, 200, cpu) == 4  # 16 programs of 64 keys: 64-key tiles
    assert num_kv_splits(1, 1, 200, cpu, kv_block=64) == 4
    q = torch.randn(2, 4, 16, generator=gen)
    dense = dense_caches(gen, 3, 2, 90, 16)
    slots, kv_lens = torch.tensor([2, 0]), torch.tensor([5, 90])
    (k_cache, v_cache), table = paged(gen, dense, page_size, fill=float("nan"), lens=lens_of(slots, kv_lens, 3))
    assert num_kv_splits(2, 2, 90, q.device, kv_block=16) > num_kv_splits(2, 2, 90, q.device)
    out = decode_attention(q, k_cache, v_cache, slots, table, kv_lens, impl="triton", kv_block=16)
    torch.testing.assert_close(out, expected(q, *dense, slots, kv_lens), rtol=1e-4, atol=1e-5)
    with pytest.raises(ConfigError, match="kv_block"):
        decode_attention(q, k_cache, v_cache, slots, table, kv_lens, impl="triton", kv_block=24)
    with pytest.raises(ConfigError, match="kv_block"):
        num_kv_splits(2, 2, 90, q.device, kv_block=24)
