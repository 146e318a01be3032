"""Split-K skinny GEMM and on-device sampling against PyTorch / the engine's sampler."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F

from athanor.errors import ConfigError
from athanor.kernels import (
    HAS_TRITON,
    KVWrite,
    fused_linear,
    fused_linear_argmax,
    greedy,
    linear,
    linear_route,
    qkv_rope_cache,
    rms_norm,
    rope_and_cache,
    route,
    router_topk,
    sample_top_k_top_p,
    splitk_linear,
)
from athanor.kernels.dispatch import router_sums
from athanor.model.sampling import sample

triton_only = pytest.mark.skipif(not HAS_TRITON, reason="Triton is not installed")


@triton_only
@pytest.mark.parametrize("m", [1, 3, 16])
@pytest.mark.parametrize("split_k", [None, 1, 3])
def test_splitk_linear_matches_f_linear(gen, m, split_k):
    x = torch.randn(m, 600, generator=gen)
    w = torch.randn(70, 600, generator=gen)
    b = torch.randn(70, generator=gen)
    out = splitk_linear(x, w, b, split_k=split_k, impl="triton")
    torch.testing.assert_close(out, F.linear(x, w, b), rtol=1e-4, atol=1e-4)


def test_linear_uses_cublas_above_sixteen_rows(gen):
    x, w = torch.randn(20, 64, generator=gen), torch.randn(8, 64, generator=gen)
    torch.testing.assert_close(linear(x, w, gemv="triton_splitk"), F.linear(x, w))


@pytest.mark.parametrize("impl", [pytest.param("triton", marks=triton_only), "torch"])
def test_greedy_is_argmax(gen, impl):
    logits = torch.randn(6, 2500, generator=gen)  # several chunks a row (512 logits each in the interpreter)
    logits[1, 2499] = 100.0  # the maximum in the last, partial block
    logits[2, 7] = logits[2, 2000] = 50.0  # a tie across chunks: the first wins
    logits[3, 600] = logits[3, 601] = 50.0  # a tie inside a chunk, and across lanes of a block
    logits[4] = 0.0  # all equal: index 0
    logits[5] = float("-inf")  # nothing finite: index 0, as torch.argmax
    assert torch.equal(greedy(logits, impl=impl), logits.argmax(-1))
    bf16 = logits[:4].to(torch.bfloat16)  # many equal values
    assert torch.equal(greedy(bf16, impl=impl), bf16.argmax(-1))
    assert torch.equal(greedy(logits.t().contiguous().t(), impl=impl), logits.argmax(-1))  # any strides


def test_top_k_top_p_with_full_k_is_the_engine_sampler(gen):
    b, vocab = 4, 300
    logits = torch.randn(b, vocab, generator=gen) * 3
    temperature = torch.tensor([0.0, 1.0, 0.7, 1.3])
    top_p = torch.tensor([1.0, 0.9, 0.5, 1.0])
    seeds = torch.randint(0, 2**31, (b,), generator=gen)
    positions = torch.randint(0, 1000, (b,), generator=gen)
    assert torch.equal(sample_top_k_top_p(logits, temperature, top_p, seeds, positions, top_k=vocab),
                       sample(logits, temperature, top_p, seeds, positions))


def test_top_k_draws_only_among_the_k_best(gen):
    b, vocab, k = 64, 200, 5
    logits = torch.randn(b, vocab, generator=gen)
    ones = torch.ones(b)
    tokens = sample_top_k_top_p(logits, ones, ones, torch.arange(b), torch.arange(b), top_k=k)
    top = torch.topk(logits, k, dim=-1).indices
    assert bool((top == tokens[:, None]).any(-1).all())


@triton_only
@pytest.mark.parametrize("m", [1, 3])
@pytest.mark.parametrize("prologue", ["none", "norm", "silu"])
@pytest.mark.parametrize("residual", [False, True])
def test_fused_linear_matches_its_torch_composition(gen, m, prologue, residual):
    k, n = 200, 70  # neither a multiple of the blocks: masked tails in K and N
    x = torch.randn(m, k, generator=gen)
    w, b = torch.randn(n, k, generator=gen), torch.randn(n, generator=gen)
    extra = {"norm": {"norm_weight": torch.randn(k, generator=gen), "eps": 1e-5},
             "silu": {"up": torch.randn(m, k, generator=gen)}, "none": {}}[prologue]
    if residual:
        extra["residual"] = torch.randn(m, n, generator=gen)
    out = fused_linear(x, w, b, **extra, impl="triton")
    torch.testing.assert_close(out, fused_linear(x, w, b, **extra, impl="torch"), rtol=1e-4, atol=1e-4)
    if prologue == "norm":  # the composition is the model's own rms_norm + F.linear
        torch.testing.assert_close(out - (extra["residual"] if residual else 0),
                                   F.linear(rms_norm(x, extra["norm_weight"], 1e-5, impl="torch"), w, b),
                                   rtol=1e-4, atol=1e-4)


@triton_only
@pytest.mark.parametrize("m, k, dtype", [(1, 64, torch.float32), (3, 192, torch.bfloat16)])  # K >= 192: split-K
def test_fused_linear_argmax_is_the_lm_head_then_its_argmax(gen, m, k, dtype):
    """The greedy LM head: its logits are `fused_linear`'s with the norm inside, bit for bit, and its tokens their
    rows' first maximum (ties across strips to the smallest column; a NaN column never wins), launch after launch
    (the tokens kernel leaves the row maxima zero, the split-K tickets are left zero)."""
    from athanor.kernels.dispatch import argmax_best, tickets

    n = 100  # strips of 16 in the interpreter, the last one short
    x = torch.randn(m, k, generator=gen).to(dtype)
    w = torch.randn(n, k, generator=gen).to(dtype)
    nw = torch.rand(k, generator=gen).to(dtype) + 0.5
    for _ in range(2):
        tokens, logits = fused_linear_argmax(x, w, nw, 1e-5)
        assert torch.equal(logits, fused_linear(x, w, norm_weight=nw, eps=1e-5, impl="triton"))
        assert torch.equal(tokens, logits.float().argmax(-1))
    best = logits.float().argmax(-1)
    tied = w.clone()
    tied[3] = tied[90] = w[int(best[0])]  # row 0's maximum three times, in up to three strips: the first one wins
    tied[50] = float("nan")  # every row's logit 50 is NaN
    tokens, logits = fused_linear_argmax(x, tied, nw, 1e-5)
    assert logits[:, 50].isnan().all()
    assert tokens[0] == min(c for c in (3, 90, int(best[0])) if c != 50)
    assert torch.equal(tokens, logits.float().nan_to_num(nan=float("-inf")).argmax(-1))
    assert not argmax_best(x.device).any() and not tickets(x.device).any()


def test_fused_linear_argmax_falls_back_to_the_lm_head_then_greedy(gen):
    x, w, nw = torch.randn(9, 32, generator=gen), torch.randn(50, 32, generator=gen), torch.rand(32, generator=gen)
    tokens, logits = fused_linear_argmax(x, w, nw, 1e-5)  # 9 rows: more than the kernel takes
    assert torch.equal(logits, fused_linear(x, w, norm_weight=nw, eps=1e-5, impl="torch"))
    assert torch.equal(tokens, logits.argmax(-1))


def test_fused_linear_reads_strided_halves_of_a_fused_gate_up(gen):
    gu = torch.randn(2, 2 * 96, generator=gen)
    w = torch.randn(40, 96, generator=gen)
    torch.testing.assert_close(fused_linear(gu[:, :96], w, up=gu[:, 96:]), F.linear(F.silu(gu[:, :96]) * gu[:, 96:], w))


def _kv_write(gen, qk_norm: bool, heads_kv: int = 2, d: int = 32, slots_n: int = 5, max_len: int = 24, m: int = 3,
              page_size: int = 8, token_major: bool = False):
    """A decode step's KVWrite into random pools of `page_size` pages, the slots' pages a shuffle of the pool."""
    per_seq = -(-max_len // page_size)
    num_pages = slots_n * per_seq + 2
    shape = (num_pages + 1, page_size, heads_kv, d) if token_major else (num_pages + 1, heads_kv, page_size, d)
    cache = [torch.randn(shape, generator=gen) for _ in range(2)]
    if token_major:
        cache = [c.transpose(1, 2) for c in cache]
    table = torch.randperm(num_pages, generator=gen)[:slots_n * per_seq].view(slots_n, per_seq).int()
    norms = [torch.randn(d, generator=gen) for _ in range(2)] if qk_norm else [None, None]
    return KVWrite(torch.randn(max_len, d, generator=gen), torch.randn(max_len, d, generator=gen),
                   torch.randint(0, max_len, (m,), generator=gen), torch.randperm(slots_n, generator=gen)[:m], table,
                   *cache, *norms)


@triton_only
@pytest.mark.parametrize(("m", "qk_norm", "bias", "page_size", "token_major"),
                         [(1, False, False, 8, False), (1, True, False, 4, True), (3, True, True, 16, False)])
def test_qkv_rope_cache_is_the_projection_then_rope_and_cache_bit_for_bit(gen, m, qk_norm, bias, page_size,
                                                                          token_major):
    """The fused kernel (RoPE by the last strip of each head) equals the two kernels it replaces exactly, and
    their torch composition within fp32 rounding, writing k and v at the positions' pages and rows."""
    heads, heads_kv, d, k = 4, 2, 32, 200  # K >= 192: the interpreter takes the split-K path too
    h = torch.randn(m, k, generator=gen)
    w = torch.randn((heads + 2 * heads_kv) * d, k, generator=gen)
    b = torch.randn(w.shape[0], generator=gen) if bias else None
    nw = torch.randn(k, generator=gen)
    cache = _kv_write(gen, qk_norm, heads_kv, d, m=m, page_size=page_size, token_major=token_major)
    results = {}
    for name in ("fused", "two_kernels", "torch"):
        c = replace(cache, k_cache=cache.k_cache.clone(), v_cache=cache.v_cache.clone())
        if name == "fused":
            q = qkv_rope_cache(h, w, b, nw, 1e-5, heads, c, impl="triton")
        else:
            impl = "torch" if name == "torch" else "triton"
            qkv = fused_linear(h, w, b, norm_weight=nw, eps=1e-5, impl=impl).view(m, -1, d)
            q = rope_and_cache(qkv[:, :heads], qkv[:, heads:heads + heads_kv], qkv[:, heads + heads_kv:], c.cos, c.sin,
                               c.positions, c.slots, c.block_table, c.k_cache, c.v_cache, impl=impl, q_norm=c.q_norm,
                               k_norm=c.k_norm, eps=1e-5)
        results[name] = (q, c.k_cache, c.v_cache)
    assert results["fused"][1].ne(cache.k_cache).any() and results["fused"][2].ne(cache.v_cache).any()
    for got, two, ref in zip(results["fused"], results["two_kernels"], results["torch"], strict=True):
        assert torch.equal(got, two)
        torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-4)


@triton_only
@pytest.mark.parametrize("m", [1, 2])
def test_qkv_rope_cache_gathers_the_first_layers_row_itself(gen, m):
    """`gather`: the QKV kernel reads its row from the embedding at the token (one row: in the kernel; more: a gather
    first) and writes it out, and everything is what the gather then the kernel make, bit for bit."""
    heads, heads_kv, d, k, vocab = 4, 2, 32, 200, 50
    table, tokens = torch.randn(vocab, k, generator=gen), torch.randint(0, vocab, (m,), generator=gen)
    w, nw = torch.randn((heads + 2 * heads_kv) * d, k, generator=gen), torch.randn(k, generator=gen)
    cache = _kv_write(gen, True, heads_kv, d, m=m)
    results = []
    for gather in (True, False):
        c = replace(cache, k_cache=cache.k_cache.clone(), v_cache=cache.v_cache.clone())
        rows = torch.full((m, k), float("nan"))
        if gather:
            q = qkv_rope_cache(table, w, None, nw, 1e-5, heads, c, impl="triton", gather=(tokens, rows))
        else:
            rows = F.embedding(tokens, table)
            q = qkv_rope_cache(rows, w, None, nw, 1e-5, heads, c, impl="triton")
        results.append((q, c.k_cache, c.v_cache, rows))
    for got, expected in zip(*results, strict=True):
        assert torch.equal(got, expected)


def test_qkv_rope_cache_rejects_a_weight_of_other_head_counts(gen):
    with pytest.raises(AssertionError, match="fused QKV"):
        qkv_rope_cache(torch.randn(1, 64), torch.randn(100, 64), None, torch.ones(64), 1e-5, 4, _kv_write(gen, False))


@pytest.mark.parametrize("impl", [pytest.param("triton", marks=triton_only), "torch"])
@pytest.mark.parametrize("m", [1, 3])
@pytest.mark.parametrize("scoring,bias", [("softmax", False), ("sigmoid", True)])
def test_router_topk_is_the_router_gemv_then_route(gen, impl, m, scoring, bias):
    experts, k = 60, 200  # 60: not a power of two (Qwen2-MoE)
    h, w, nw = torch.randn(m, k, generator=gen), torch.randn(experts, k, generator=gen), torch.randn(k, generator=gen)
    sel = torch.randn(experts, generator=gen) * 0.1 if bias else None
    ids, weights = router_topk(h, w, nw, 1e-5, 4, scoring, True, sel, impl=impl)
    logits = fused_linear(h, w, norm_weight=nw, eps=1e-5, impl=impl)
    ref_ids, ref_weights = route(logits, 4, scoring, True, sel, impl=impl)
    assert torch.equal(ids, ref_ids) and torch.equal(weights, ref_weights)
    torch_ids, torch_weights = route(fused_linear(h, w, norm_weight=nw, eps=1e-5, impl="torch"), 4, scoring, True, sel,
                                     impl="torch")
    assert torch.equal(ids, torch_ids)
    torch.testing.assert_close(weights, torch_weights, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("impl", [pytest.param("triton", marks=triton_only), "torch"])
@pytest.mark.parametrize("m", [1, 3])
@pytest.mark.parametrize("scoring,bias", [("softmax", False), ("sigmoid", True)])
def test_linear_route_is_the_projection_then_the_router_gemv_then_route(gen, impl, m, scoring, bias):
    """The O projection summing the router's logits as it writes h: h is `fused_linear`'s bit for bit, the logits the
    router GEMV's up to where the RMSNorm's scale is applied, the ids the same; a second call gives the same again
    (the routing kernel leaves its sums zero)."""
    experts, hidden, k = 60, 96, 200  # 60: not a power of two (Qwen2-MoE)
    x, w = torch.randn(m, k, generator=gen), torch.randn(hidden, k, generator=gen) / k**0.5
    residual, nw = torch.randn(m, hidden, generator=gen), torch.randn(hidden, generator=gen)
    router_w = torch.randn(experts, hidden, generator=gen)
    sel = torch.randn(experts, generator=gen) * 0.1 if bias else None
    first = linear_route(x, w, residual, router_w, nw, 1e-5, 4, scoring, True, sel, impl=impl)
    again = linear_route(x, w, residual, router_w, nw, 1e-5, 4, scoring, True, sel, impl=impl)
    assert all(torch.equal(a, b) for a, b in zip(first, again, strict=True))
    h, logits, ids, weights = first
    assert torch.equal(h, fused_linear(x, w, residual=residual, impl=impl))
    ref_logits = fused_linear(h, router_w, norm_weight=nw, eps=1e-5, impl="torch")
    torch.testing.assert_close(logits, ref_logits, rtol=1e-5, atol=1e-5)
    ref_ids, ref_weights = route(ref_logits, 4, scoring, True, sel, impl="torch")
    assert torch.equal(ids, ref_ids)
    torch.testing.assert_close(weights, ref_weights, rtol=1e-5, atol=1e-6)


@triton_only
def test_linear_route_ranks_the_same_in_chunks(gen):
    """route_chunk: the routing kernel's ranks counted 8 rivals at a time from stored choosers, and its picks in
    rounds of one max ("max"), give what all at once in registers (0) gives, bit for bit (3 rows: each its own
    scratch row); route_warps 1 gives the same; values not offered are refused before any launch."""
    experts, hidden, k = 60, 96, 200
    x, w = torch.randn(3, k, generator=gen), torch.randn(hidden, k, generator=gen) / k**0.5
    residual, nw = torch.randn(3, hidden, generator=gen), torch.randn(hidden, generator=gen)
    router_w = torch.randn(experts, hidden, generator=gen)
    call = (x, w, residual, router_w, nw, 1e-5, 4, "softmax", True, None)
    at_once = linear_route(*call, impl="triton", route_chunk=0)
    chunked = linear_route(*call, impl="triton", route_chunk=8)
    assert all(torch.equal(a, b) for a, b in zip(at_once, chunked, strict=True))
    assert all(torch.equal(a, b) for a, b in zip(at_once, linear_route(*call, impl="triton", route_chunk="max"),
                                                 strict=True))
    with pytest.raises(ConfigError, match="route_chunk"):
        linear_route(*call, impl="triton", route_chunk=6)
    # the refused call launched nothing: the sums are still zero
    assert all(torch.equal(a, b) for a, b in zip(chunked, linear_route(*call, impl="triton", route_chunk=8),
                                                 strict=True))
    with pytest.raises(ConfigError, match="route_warps"):  # 8 broke the ranks on an H200: refused, as a bad chunk is
        linear_route(*call, impl="triton", route_chunk=8, route_warps=8)
    assert all(torch.equal(a, b) for a, b in zip(chunked, linear_route(*call, impl="triton", route_chunk=8,
                                                                       route_warps=1), strict=True))


@triton_only
def test_linear_route_sums_spread_apart_route_the_same(gen):
    """sums_spread: the router's sums 16 or 256 int64s apart (each on its own 128-byte line; 256 more than the array
    holds for 3 rows of 60 experts, so as far apart as it does) give what packed sums give, bit for bit, and leave
    the spread sums zero for the next launch; a bad value is refused."""
    experts, hidden, k = 60, 96, 200
    x, w = torch.randn(3, k, generator=gen), torch.randn(hidden, k, generator=gen) / k**0.5
    residual, nw = torch.randn(3, hidden, generator=gen), torch.randn(hidden, generator=gen)
    call = (x, w, residual, torch.randn(experts, hidden, generator=gen), nw, 1e-5, 4, "softmax", True, None)
    packed = linear_route(*call, impl="triton", sums_spread=1)
    for spread in (16, 256):
        assert all(torch.equal(a, b) for a, b in zip(packed, linear_route(*call, impl="triton", sums_spread=spread),
                                                     strict=True))
        assert not router_sums(x.device).any()
    with pytest.raises(ConfigError, match="sums_spread"):
        linear_route(*call, impl="triton", sums_spread=3)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows", [1, 16, 384])
def test_onednn_linear_is_f_linear_up_to_rounding(gen, dtype, rows):
    """A weight packed once serves every row count, with or without a bias, on strided rows too."""
    from athanor.kernels.onednn import has_onednn, onednn_linear, pack_weight

    if not has_onednn(dtype):
        pytest.skip(f"this torch build or CPU has no oneDNN {dtype} linear (bf16 needs AVX-512 or AVX-NE-CONVERT)")

    w = (torch.randn(200, 96, generator=gen) * 0.1).to(dtype)
    bias = torch.randn(200, generator=gen).to(dtype)
    packed = pack_weight(w)
    x = torch.randn(rows, 192, generator=gen).to(dtype)[:, ::2]  # rows with a stride of 2
    tol = {"rtol": 1e-5, "atol": 1e-5} if dtype == torch.float32 else {"rtol": 1.6e-2, "atol": 1e-2}
    for b in (None, bias):
        out = onednn_linear(x, packed, b)
        assert out.dtype == dtype and out.shape == (rows, 200)
        torch.testing.assert_close(out, F.linear(x, w, b), **tol)
