"""The Triton kernels in bf16 on CPU (the interpreter patched to compute bf16 as the GPU does).

The GPU tests compare bf16 paths; these reproduce them without a GPU. The rule every test here
follows: a bf16 fast path is judged against an fp64 truth computed from the *same* bf16 inputs,
next to the bf16 reference's own error against that truth. Comparing two bf16 computations
element-wise (assert_close at 2e-2) is not a sound test: each rounds differently, and the bf16
reference is often the less accurate of the two (see the MoE case below).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from athanor.kernels import (
    HAS_TRITON,
    add_rms_norm,
    decode_attention,
    fused_linear,
    moe_experts,
    rms_norm,
    rope_and_cache,
    route,
    silu_mul,
    splitk_linear,
)
from athanor.model import reference

pytestmark = pytest.mark.skipif(not HAS_TRITON, reason="Triton is not installed")
BF16 = torch.bfloat16


def rel_err(x: torch.Tensor, truth: torch.Tensor) -> float:
    """||x - truth|| / ||truth|| in fp64."""
    return float((x.double() - truth).norm() / truth.norm())


def test_interpreter_rounds_bf16_like_torch(gen):
    from athanor.kernels.interpreter import bf16_bits_to_f32, f32_to_bf16_bits

    x = torch.cat([torch.randn(4096, generator=gen) * 100, torch.tensor([1 + 2**-8, 1 + 3 * 2**-8, -0.0, 1e-40])])
    x = torch.cat([x, torch.tensor([float("nan"), float("inf")])])
    bits = f32_to_bf16_bits(x.numpy())
    expected = x.to(BF16)
    assert np.array_equal(bits[:-2], expected.view(torch.int16).numpy().view(np.uint16)[:-2])
    assert np.isnan(bf16_bits_to_f32(bits[-2:-1]))[0] and bf16_bits_to_f32(bits[-1:])[0] == np.inf
    assert np.array_equal(bf16_bits_to_f32(bits[:-2]), expected[:-2].float().numpy())


def test_norms_and_silu_mul_equal_the_fallback_in_bf16(gen):
    x, r = torch.randn(5, 300, generator=gen).to(BF16), torch.randn(5, 300, generator=gen).to(BF16)
    w = torch.randn(300, generator=gen).to(BF16)
    assert torch.equal(rms_norm(x, w, 1e-5, impl="triton"), rms_norm(x, w, 1e-5, impl="torch"))
    for a, b in zip(add_rms_norm(x, r, w, 1e-5, impl="triton"), add_rms_norm(x, r, w, 1e-5, impl="torch")):
        assert torch.equal(a, b)
    assert torch.equal(silu_mul(x, r, impl="triton"), silu_mul(x, r, impl="torch"))


def test_rope_and_cache_in_bf16_is_at_least_as_accurate_as_the_fallback(gen):
    n, hq, hkv, d, slots_n, max_len, page_size = 4, 8, 2, 64, 5, 40, 8
    q, k, v = (torch.randn(n, h, d, generator=gen).to(BF16) for h in (hq, hkv, hkv))
    ang = torch.rand(max_len, d // 2, generator=gen, dtype=torch.float64) * 6.3
    cos64, sin64 = torch.cat([ang.cos()] * 2, -1), torch.cat([ang.sin()] * 2, -1)
    cos, sin = cos64.to(BF16), sin64.to(BF16)
    pos, slots = torch.tensor([0, 7, 39, 3]), torch.tensor([4, 0, 2, 1])  # slot 4: a padding row
    num_pages = slots_n * max_len // page_size
    table = torch.randperm(num_pages, generator=gen).view(slots_n, -1).int()  # shuffled pages
    table[4] = num_pages  # the padding row's: all the scratch page
    caches = [torch.zeros(num_pages + 1, hkv, page_size, d, dtype=BF16) for _ in range(4)]
    qa = rope_and_cache(q, k, v, cos, sin, pos, slots, table, caches[0], caches[1], impl="triton")
    qb = rope_and_cache(q, k, v, cos, sin, pos, slots, table, caches[2], caches[3], impl="torch")
    c, s = cos.double()[pos], sin.double()[pos]
    q_true, k_true = reference.apply_rope(q.double(), c, s), reference.apply_rope(k.double(), c, s)
    pages, rows = table[slots, pos // page_size].long(), pos % page_size
    assert rel_err(qa, q_true) <= rel_err(qb, q_true) + 1e-6
    assert rel_err(caches[0][pages, :, rows], k_true) <= rel_err(caches[2][pages, :, rows], k_true) + 1e-6
    assert torch.equal(caches[1], caches[3])  # v is copied, not computed
    written = torch.zeros(num_pages + 1, page_size, dtype=torch.bool)
    written[pages, rows] = True
    assert not caches[0].transpose(1, 2)[~written].any()  # nothing written outside [page, :, row]


@pytest.mark.parametrize("num_splits", [1, 4, 16])
def test_decode_attention_in_bf16_against_fp64(gen, num_splits):
    b, hq, hkv, d, page_size, per_seq = 3, 8, 2, 64, 16, 19  # 300 keys: 19 pages, the last one part full
    q = torch.randn(b, hq, d, generator=gen).to(BF16)
    num_pages = (b + 1) * per_seq
    k_cache, v_cache = (torch.randn(num_pages + 1, page_size, hkv, d, generator=gen).to(BF16).transpose(1, 2)
                        for _ in range(2))  # token-major
    table = torch.randperm(num_pages, generator=gen).view(b + 1, per_seq).int()  # shuffled pages
    slots, kv_lens = torch.tensor([3, 0, 1]), torch.tensor([1, 130, 300])  # 1 key: most splits are empty
    out = decode_attention(q, k_cache, v_cache, slots, table, kv_lens, num_splits=num_splits, impl="triton")
    fallback = decode_attention(q, k_cache, v_cache, slots, table, kv_lens, impl="torch")
    truth = decode_attention(q.double(), k_cache.double(), v_cache.double(), slots, table, kv_lens, impl="torch")
    assert rel_err(out, truth) <= 2 * rel_err(fallback, truth)
    assert rel_err(out, truth) < 1e-2


def test_splitk_linear_in_bf16_against_fp64(gen):
    x, w = torch.randn(3, 1024, generator=gen).to(BF16), (torch.randn(96, 1024, generator=gen) / 32).to(BF16)
    truth = x.double() @ w.double().T
    assert rel_err(splitk_linear(x, w, split_k=4, impl="triton"), truth) <= 2 * rel_err(F.linear(x, w), truth)


def test_route_on_bf16_logits_differs_from_torch_only_by_tie_order(gen):
    # bf16 logits tie often: among 128 experts, about one row in four has equal values in its top 9.
    logits = torch.randn(64, 128, generator=gen).to(BF16)
    logits[0, 5] = logits[0, 17] = logits[0].max() + 1  # a certain tie for the first choice
    ids, weights = route(logits, 8, "softmax", True, impl="triton")
    ref_ids, ref_weights = route(logits, 8, "softmax", True, impl="torch")
    scores = torch.softmax(logits.float(), dim=-1)
    assert_same_routing(scores, ids, weights, ref_ids, ref_weights)
    assert ids[0, :2].tolist() == [5, 17]  # the kernel breaks a tie by the lower expert id


def assert_same_routing(scores, ids, weights, ref_ids, ref_weights):
    """Tie-aware routing equality: the same score at every rank (so the same set of experts up to
    swaps among equal scores), distinct experts per row, and the same weights."""
    assert torch.equal(scores.gather(1, ids), scores.gather(1, ref_ids))
    assert all(len(set(row)) == len(row) for row in ids.tolist())
    torch.testing.assert_close(weights, ref_weights, rtol=1e-5, atol=1e-6)


def test_assert_same_routing_rejects_a_wrong_expert(gen):
    logits = torch.randn(4, 16, generator=gen)
    ids, weights = route(logits, 2, "softmax", True, impl="torch")
    wrong = ids.clone()
    wrong[1, 1] = int(torch.topk(logits[1], 3).indices[2])  # the third choice instead of the second
    with pytest.raises(AssertionError):
        assert_same_routing(torch.softmax(logits, -1), wrong, weights, ids, weights)


@pytest.mark.parametrize("backend", ["triton", "grouped_mm"])
def test_moe_backends_in_bf16_are_as_accurate_as_the_loop(gen, backend):
    """The GPU's bf16 MoE failure, on CPU: the fast backends differ from the bf16 loop by several bf16
    ulps on a few percent of outputs, yet are *closer* to the truth than the loop, which rounds each
    expert's output, its weight and every partial sum of index_add_ to bf16."""
    n, e, h, i, k = 6, 8, 256, 96, 4
    x = torch.randn(n, h, generator=gen).to(BF16)
    w_gate = (torch.randn(e, i, h, generator=gen) * h**-0.5).to(BF16)
    w_up = torch.randn(e, i, h, generator=gen).to(BF16)  # unscaled, as the GPU test: outputs ~10
    w_down = (torch.randn(e, h, i, generator=gen) * i**-0.5).to(BF16)
    ids, weights = route(torch.randn(n, e, generator=gen), k, "softmax", True, impl="torch")
    truth = moe_experts(x.double(), (w_gate.double(), w_up.double()), w_down.double(), ids, weights.double(),
                        backend="loop")
    loop = moe_experts(x, (w_gate, w_up), w_down, ids, weights, backend="loop")
    out = moe_experts(x, (w_gate, w_up), w_down, ids, weights, backend=backend)
    assert rel_err(out, truth) <= 1.25 * rel_err(loop, truth)
    assert rel_err(out, truth) < 1e-2


@pytest.mark.parametrize("prologue", ["norm", "silu"])
def test_fused_linear_in_bf16_against_fp64(gen, prologue):
    """The prologue rounds as the unfused kernels do (so the projection's input is the same bf16 tensor);
    the product is then at least as accurate as cuBLAS-style F.linear's, against fp64 from those inputs."""
    m, k, n = 2, 512, 96
    x, r = torch.randn(m, k, generator=gen).to(BF16), torch.randn(m, n, generator=gen).to(BF16)
    w = (torch.randn(n, k, generator=gen) / 16).to(BF16)
    nw, up = torch.randn(k, generator=gen).to(BF16), torch.randn(m, k, generator=gen).to(BF16)
    extra = {"norm_weight": nw, "eps": 1e-5} if prologue == "norm" else {"up": up}
    a = rms_norm(x, nw, 1e-5, impl="torch") if prologue == "norm" else silu_mul(x, up, impl="torch")
    truth = a.double() @ w.double().T
    out = fused_linear(x, w, **extra, residual=r, impl="triton") - r.double()
    # The residual add rounds once more; a second projection in one ulp of |r| is the bound it adds.
    assert rel_err(out, truth) <= 2 * rel_err(F.linear(a, w), truth) + 2**-8 * float(r.double().norm() / truth.norm())
    assert rel_err(fused_linear(x, w, **extra, impl="triton"), truth) <= 2 * rel_err(F.linear(a, w), truth)
