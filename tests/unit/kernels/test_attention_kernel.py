"""Split-KV decode attention against the reference's decode_attention, on fresh random caches."""

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
from athanor.model import reference

triton_only = pytest.mark.skipif(not HAS_TRITON, reason="Triton is not installed")
IMPLS = [pytest.param("triton", marks=triton_only), "torch"]


def _expected(q, k_cache, v_cache, slots, kv_lens):
    """reference.decode_attention over the gathered slots, masked to each row's length."""
    kv_len = int(kv_lens.max())
    keys = k_cache[:, :, :kv_len].index_select(0, slots)
    values = v_cache[:, :, :kv_len].index_select(0, slots)
    mask = torch.arange(kv_len)[None, :] < kv_lens[:, None]
    return reference.decode_attention(q, keys, values, mask).view(q.shape)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize(("hq", "hkv"), [(4, 4), (4, 2), (8, 1)])
@pytest.mark.parametrize("num_splits", [None, 1, 3])
def test_decode_attention_gqa_and_splits(gen, impl, hq, hkv, num_splits):
    b, d, max_len, slots_n = 3, 16, 200, 5
    q = torch.randn(b, hq, d, generator=gen)
    k_cache = torch.randn(slots_n, hkv, max_len, d, generator=gen)
    v_cache = torch.randn(slots_n, hkv, max_len, d, generator=gen)
    slots = torch.randperm(slots_n, generator=gen)[:b]
    kv_lens = torch.tensor([1, int(torch.randint(2, 70, (1,), generator=gen)), 200])  # 1 key, one tile+, full
    out = decode_attention(q, k_cache, v_cache, slots, kv_lens, num_splits=num_splits, impl=impl)
    torch.testing.assert_close(out, _expected(q, k_cache, v_cache, slots, kv_lens), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("impl", IMPLS)
def test_decode_attention_on_a_token_major_view(gen, impl):
    b, hq, hkv, d, max_len = 2, 4, 2, 16, 96
    q = torch.randn(b, hq, d, generator=gen)
    k_cache = torch.randn(3, max_len, hkv, d, generator=gen).transpose(1, 2)
    v_cache = torch.randn(3, max_len, hkv, d, generator=gen).transpose(1, 2)
    slots, kv_lens = torch.tensor([2, 0]), torch.tensor([96, 37])
    out = decode_attention(q, k_cache, v_cache, slots, kv_lens, impl=impl)
    torch.testing.assert_close(out, _expected(q, k_cache, v_cache, slots, kv_lens), rtol=1e-4, atol=1e-5)


def test_static_torch_path_equals_the_eager_one(gen):
    q = torch.randn(2, 4, 16, generator=gen)
    k_cache, v_cache = torch.randn(3, 2, 64, 16, generator=gen), torch.randn(3, 2, 64, 16, generator=gen)
    slots, kv_lens = torch.tensor([0, 2]), torch.tensor([5, 17])
    torch.testing.assert_close(
        decode_attention(q, k_cache, v_cache, slots, kv_lens, static=True, impl="torch"),
        decode_attention(q, k_cache, v_cache, slots, kv_lens, impl="torch"), rtol=1e-5, atol=1e-6)


def test_num_kv_splits_is_static_and_bounded():
    cpu = torch.device("cpu")
    assert num_kv_splits(1, 8, 32768, cpu) == 4  # 4 programs per "SM" (8 on CPU) over 8 heads
    assert num_kv_splits(128, 8, 32768, cpu) == 1
    assert num_kv_splits(1, 1, 100, cpu) == 4  # never more splits than tiles (32 keys: 2 of 64 leave SMs idle)
    assert num_kv_splits(4, 2, 100, cpu) == 2  # 16 programs of 64 keys for 8 SMs: 64-key tiles


@pytest.mark.parametrize("attend", [decode_attention_per_seq, decode_attention_flex], ids=["per_seq", "flex"])
@pytest.mark.parametrize(("slots", "kv_lens"), [
    ([2, 3, 4, 5], [90, 100, 96, 100]),  # consecutive slots, similar lengths: the batched view path
    ([2, 3, 4, 5], [5, 10, 96, 100]),  # consecutive, but short rows would waste keys: one row at a time
    ([5, 1, 3, 0], [90, 100, 96, 100]),  # slots out of order: one row at a time
    ([4, 5, 6], [128, 1, 127]),  # a one-key row and the cache's last key (flex: its length mask)
    ([0, 1], [40, 40]),  # 8 keys modulo 16: the length torch 2.13's flex attention got wrong at 16-wide heads
])
def test_per_seq_attention_paths_agree(gen, attend, slots, kv_lens):
    hq, hkv, d, max_len, num_slots = 6, 3, 32, 128, 7
    q = torch.randn(len(slots), hq, d, generator=gen)
    k_cache = torch.randn(num_slots, hkv, max_len, d, generator=gen)
    v_cache = torch.randn(num_slots, hkv, max_len, d, generator=gen)
    s, n = torch.tensor(slots), torch.tensor(kv_lens)
    out = attend(q, k_cache, v_cache, s, n)
    torch.testing.assert_close(out, _expected(q, k_cache, v_cache, s, n), rtol=1e-4, atol=1e-5)


def test_flex_attention_leaves_narrow_heads_to_the_per_row_path(gen, monkeypatch):
    """16-wide heads never reach the compiled flex attention (wrong at some lengths, see flex_decode)."""
    from athanor.kernels import flex_decode

    monkeypatch.setattr(flex_decode, "_compiled", lambda: pytest.fail("flex attention ran on 16-wide heads"))
    q, k_cache, v_cache = (torch.randn(*shape, generator=gen) for shape in ((2, 6, 16), (3, 3, 64, 16), (3, 3, 64, 16)))
    s, n = torch.tensor([0, 1]), torch.tensor([40, 40])
    out = flex_decode.decode_attention_flex(q, k_cache, v_cache, s, n)
    torch.testing.assert_close(out, _expected(q, k_cache, v_cache, s, n), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize(("hq", "hkv", "num_splits", "qk_norm", "d"),
                         [(4, 2, None, False, 16), (8, 1, 3, True, 16), (4, 4, 1, True, 16),
                          (8, 1, 6, False, 128)])  # the merge in chunks of 4 splits ([8, 4, 128] tiles)
def test_rope_cache_attention_is_rope_and_cache_then_attention(gen, impl, hq, hkv, num_splits, qk_norm, d):
    """The fused kernel against its two steps: the same output, and the same caches afterwards (the new
    token's rotated k and its v written, nothing else touched)."""
    from athanor.kernels import KVWrite, rope_and_cache, rope_cache_attention

    b, max_len, slots_n = 3, 200, 5
    qkv = torch.randn(b, hq + 2 * hkv, d, generator=gen)  # q, k, v as views of one fused projection
    q, k, v = qkv[:, :hq], qkv[:, hq:hq + hkv], qkv[:, hq + hkv:]
    cos, sin = torch.randn(max_len, d, generator=gen), torch.randn(max_len, d, generator=gen)
    norms = (torch.randn(d, generator=gen), torch.randn(d, generator=gen)) if qk_norm else (None, None)
    caches = [torch.randn(slots_n, hkv, max_len, d, generator=gen) for _ in range(2)]
    slots = torch.randperm(slots_n, generator=gen)[:b]
    positions = torch.tensor([0, int(torch.randint(1, 70, (1,), generator=gen)), max_len - 1])
    kv_lens = positions + 1
    expected_k, expected_v = caches[0].clone(), caches[1].clone()
    rq = rope_and_cache(q, k, v, cos, sin, positions, slots, expected_k, expected_v, impl="torch",
                        q_norm=norms[0], k_norm=norms[1], eps=1e-6)
    expected = _expected(rq, expected_k, expected_v, slots, kv_lens)
    for _ in range(2):  # twice: the split tickets are reset for the next launch
        k_cache, v_cache = caches[0].clone(), caches[1].clone()
        kv = KVWrite(cos, sin, positions, slots, k_cache, v_cache, *norms)
        out = rope_cache_attention(q, k, v, kv, kv_lens, 1e-6, num_splits=num_splits, impl=impl)
        torch.testing.assert_close(out, expected, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(k_cache, expected_k, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(v_cache, expected_v)


@pytest.mark.parametrize("impl", IMPLS)
def test_lens_offset_attends_one_key_more_per_row(gen, impl):
    """A decode step passes its positions with lens_offset=1: the same as passing positions + 1."""
    q = torch.randn(3, 4, 16, generator=gen)
    k_cache, v_cache = torch.randn(4, 2, 80, 16, generator=gen), torch.randn(4, 2, 80, 16, generator=gen)
    slots, positions = torch.tensor([3, 0, 1]), torch.tensor([0, 41, 79])
    torch.testing.assert_close(decode_attention(q, k_cache, v_cache, slots, positions, impl=impl, lens_offset=1),
                               decode_attention(q, k_cache, v_cache, slots, positions + 1, impl=impl), rtol=0, atol=0)


@triton_only
@pytest.mark.parametrize("num_splits", [None, 1, 3, 8])
def test_early_keys_attends_the_same_bits(gen, num_splits):
    """early_keys (the split's first tile loaded before the PDL wait, the newest key re-read after it) peels the
    first tile off the loop: the same sums in the same order, for rows of one key, of splits with no keys (8 splits
    of 2 keys), of one tile and of several tiles a split (BLOCK_N 64; 200 keys in one split)."""
    q = torch.randn(4, 4, 16, generator=gen)
    k_cache, v_cache = torch.randn(5, 2, 200, 16, generator=gen), torch.randn(5, 2, 200, 16, generator=gen)
    slots, kv_lens = torch.tensor([3, 0, 1, 4]), torch.tensor([1, 2, 70, 200])
    out = decode_attention(q, k_cache, v_cache, slots, kv_lens, num_splits=num_splits, impl="triton",
                           early_keys=True)
    assert torch.equal(out, decode_attention(q, k_cache, v_cache, slots, kv_lens, num_splits=num_splits,
                                             impl="triton"))
    torch.testing.assert_close(out, _expected(q, k_cache, v_cache, slots, kv_lens), rtol=1e-4, atol=1e-5)


@triton_only
@pytest.mark.parametrize("param", ["split_warps", "merge_warps"])
def test_split_and_merge_warps_parameters(gen, param):
    """The split and merge kernels' warps give the same bits at 1 and 4 (on the interpreter: the plumbing), and a
    value not offered fails with an error naming the parameter."""
    q = torch.randn(2, 4, 16, generator=gen)
    k_cache, v_cache = torch.randn(3, 2, 90, 16, generator=gen), torch.randn(3, 2, 90, 16, generator=gen)
    slots, kv_lens = torch.tensor([2, 0]), torch.tensor([5, 90])
    four = decode_attention(q, k_cache, v_cache, slots, kv_lens, num_splits=3, impl="triton", **{param: 4})
    assert torch.equal(four, decode_attention(q, k_cache, v_cache, slots, kv_lens, num_splits=3, impl="triton",
                                              **{param: 1}))
    with pytest.raises(ConfigError, match=param):
        decode_attention(q, k_cache, v_cache, slots, kv_lens, num_splits=3, impl="triton", **{param: 8})


@triton_only
def test_kv_block_parameter_sets_the_tiles_and_the_splits(gen):
    """kv_block: 16-key tiles give a 90-key cache more splits (`num_kv_splits`) and the same attention up to the
    merge's rounding, for rows of one tile and of several; a value not offered fails naming the parameter. Unset,
    the tiles are halved (32 keys) only where 64 would give fewer split programs than SMs (8 on the CPU)."""
    from athanor.kernels import num_kv_splits

    cpu = torch.device("cpu")
    assert num_kv_splits(1, 1, 200, cpu) == 7  # 4 programs of 64 keys for 8 SMs: 32-key tiles
    assert num_kv_splits(2, 2, 200, cpu) == 4  # 16 programs of 64 keys: 64-key tiles
    assert num_kv_splits(1, 1, 200, cpu, kv_block=64) == 4
    q = torch.randn(2, 4, 16, generator=gen)
    k_cache, v_cache = torch.randn(3, 2, 90, 16, generator=gen), torch.randn(3, 2, 90, 16, generator=gen)
    slots, kv_lens = torch.tensor([2, 0]), torch.tensor([5, 90])
    assert num_kv_splits(2, 2, 90, q.device, kv_block=16) > num_kv_splits(2, 2, 90, q.device)
    out = decode_attention(q, k_cache, v_cache, slots, kv_lens, impl="triton", kv_block=16)
    torch.testing.assert_close(out, _expected(q, k_cache, v_cache, slots, kv_lens), rtol=1e-4, atol=1e-5)
    with pytest.raises(ConfigError, match="kv_block"):
        decode_attention(q, k_cache, v_cache, slots, kv_lens, impl="triton", kv_block=24)
    with pytest.raises(ConfigError, match="kv_block"):
        num_kv_splits(2, 2, 90, q.device, kv_block=24)
