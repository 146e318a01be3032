"""RMSNorm (+ residual), SiLU-and-multiply and rotary embedding: Triton vs fallback vs reference."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from athanor.kernels import HAS_TRITON, add_rms_norm, rms_norm, rope, rope_and_cache, silu_mul
from athanor.model import reference

triton_only = pytest.mark.skipif(not HAS_TRITON, reason="Triton is not installed")
IMPLS = [pytest.param("triton", marks=triton_only), "torch"]


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("shape", [(5, 40), (2, 3, 16)])
def test_rms_norm_matches_reference(gen, impl, shape):
    x = torch.randn(shape, generator=gen)
    w = torch.randn(shape[-1], generator=gen)
    expected = reference.rms_norm(x, w, 1e-5)
    torch.testing.assert_close(rms_norm(x, w, 1e-5, impl=impl), expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("impl", IMPLS)
def test_add_rms_norm_returns_norm_of_sum_and_sum(gen, impl):
    x, r = torch.randn(4, 72, generator=gen), torch.randn(4, 72, generator=gen)
    w = torch.randn(72, generator=gen)
    out, h = add_rms_norm(x, r, w, 1e-6, impl=impl)
    torch.testing.assert_close(h, x + r)
    torch.testing.assert_close(out, reference.rms_norm(x + r, w, 1e-6), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("impl", IMPLS)
def test_silu_mul_on_halves_of_a_fused_output(gen, impl):
    gu = torch.randn(3, 2 * 1100, generator=gen)  # > one 1024 block per row
    gate, up = gu[:, :1100], gu[:, 1100:]
    torch.testing.assert_close(silu_mul(gate, up, impl=impl), F.silu(gate) * up, rtol=1e-5, atol=1e-6)


def _qkv(gen, n=4, hq=4, hkv=2, d=16):
    qkv = torch.randn(n, (hq + 2 * hkv) * d, generator=gen)  # strided views, as a fused QKV GEMM leaves them
    q = qkv[:, : hq * d].view(n, hq, d)
    k = qkv[:, hq * d : (hq + hkv) * d].view(n, hkv, d)
    v = qkv[:, (hq + hkv) * d :].view(n, hkv, d)
    return q, k, v


@pytest.mark.parametrize("impl", IMPLS)
def test_rope_matches_reference_apply_rope(gen, impl):
    q, k, _ = _qkv(gen)
    cos, sin = torch.randn(32, 16, generator=gen), torch.randn(32, 16, generator=gen)
    positions = torch.randint(0, 32, (4,), generator=gen)
    rq, rk = rope(q, k, cos, sin, positions, impl=impl)
    c, s = cos[positions], sin[positions]
    torch.testing.assert_close(rq, reference.apply_rope(q, c, s), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(rk, reference.apply_rope(k, c, s), rtol=1e-5, atol=1e-5)


def unpaged(pool, table):
    """The dense cache [S, Hkv, pages_per_seq * page_size, D] a pool and its block table hold (page by page)."""
    return torch.stack([torch.cat([pool[p] for p in row], dim=1) for row in table.tolist()])


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize(("page_size", "token_major"), [(4, False), (8, True), (16, False), (16, True)])
def test_rope_and_cache_writes_rotated_k_and_v(gen, impl, page_size, token_major):
    """k and v land at their position's page (a shuffled pool's) and row, in either layout: the dense cache the
    pool holds is the old one with [slot, :, position] written, and the pages no slot holds are untouched."""
    q, k, v = _qkv(gen)
    slots_n, max_len, hkv, d = 6, 32, 2, 16
    per_seq = max_len // page_size
    num_pages = slots_n * per_seq + 2
    cos, sin = torch.randn(max_len, d, generator=gen), torch.randn(max_len, d, generator=gen)
    positions = torch.randint(0, max_len, (4,), generator=gen)
    slots = torch.randperm(slots_n, generator=gen)[:4]
    order = torch.randperm(num_pages + 1, generator=gen)
    table, spare = order[:slots_n * per_seq].view(slots_n, per_seq).int(), order[slots_n * per_seq:]
    shape = (num_pages + 1, page_size, hkv, d) if token_major else (num_pages + 1, hkv, page_size, d)
    k_cache, v_cache = (torch.randn(shape, generator=gen) for _ in range(2))
    if token_major:
        k_cache, v_cache = k_cache.transpose(1, 2), v_cache.transpose(1, 2)
    k_before, v_before = k_cache.clone(), v_cache.clone()
    k_expected, v_expected = unpaged(k_cache, table), unpaged(v_cache, table)
    c, s = cos[positions], sin[positions]
    k_expected[slots, :, positions] = reference.apply_rope(k, c, s)
    v_expected[slots, :, positions] = v
    rq = rope_and_cache(q, k, v, cos, sin, positions, slots, table, k_cache, v_cache, impl=impl)
    torch.testing.assert_close(rq, reference.apply_rope(q, c, s), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(unpaged(k_cache, table), k_expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(unpaged(v_cache, table), v_expected)
    assert torch.equal(k_cache[spare], k_before[spare]) and torch.equal(v_cache[spare], v_before[spare])
