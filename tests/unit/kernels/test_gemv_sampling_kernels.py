"""Split-K skinny GEMM and on-device sampling against PyTorch / the engine's sampler."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from athanor.kernels import (
    HAS_TRITON,
    fused_linear,
    greedy,
    linear,
    rms_norm,
    sample_top_k_top_p,
    splitk_linear,
)
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
    logits = torch.randn(3, 2500, generator=gen)
    logits[1, 2499] = 100.0  # the maximum in the last, partial block
    assert torch.equal(greedy(logits, impl=impl), logits.argmax(-1))


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


def test_fused_linear_reads_strided_halves_of_a_fused_gate_up(gen):
    gu = torch.randn(2, 2 * 96, generator=gen)
    w = torch.randn(40, 96, generator=gen)
    torch.testing.assert_close(fused_linear(gu[:, :96], w, up=gu[:, 96:]), F.linear(F.silu(gu[:, :96]) * gu[:, 96:], w))
