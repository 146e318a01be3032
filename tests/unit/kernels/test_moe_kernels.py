"""MoE routing, grouping by expert and the expert MLP backends against the reference."""

from __future__ import annotations

import pytest
import torch

from athanor.errors import ConfigError
from athanor.kernels import (
    HAS_TRITON,
    MoeBlockConfig,
    RouterLogits,
    expert_gemv,
    group_by_expert,
    grouped_mm,
    linear_route,
    moe_experts,
    rms_norm,
    route,
    routed_experts,
)
from athanor.model import reference

triton_only = pytest.mark.skipif(not HAS_TRITON, reason="Triton is not installed")
IMPLS = [pytest.param("triton", marks=triton_only), "torch"]

if HAS_TRITON:
    import triton
    import triton.language as tl

    from athanor.kernels.jit.moe import rank_logits

    @triton.jit
    def _ranks_kernel(LOGITS, BIAS, RANKS, WEIGHTS, CHOOSERS, E, TOP_K: tl.constexpr, SOFTMAX: tl.constexpr,
                      HAS_BIAS: tl.constexpr, BLOCK_E: tl.constexpr, CHUNK: tl.constexpr):
        """`rank_logits` on each row of LOGITS [rows, E]: the picks' ranks (-1 for the rest) and weights."""
        row = tl.program_id(0)
        e = tl.arange(0, BLOCK_E)
        logits = tl.load(LOGITS + row * E + e, mask=e < E, other=float("-inf"))
        rank, chosen, weights = rank_logits(logits, BIAS, e, E, TOP_K, SOFTMAX, True, HAS_BIAS,
                                            CHOOSERS + row * BLOCK_E, CHUNK)
        tl.store(RANKS + row * E + e, tl.where(chosen, rank, -1), mask=e < E)
        tl.store(WEIGHTS + row * E + e, tl.where(chosen, weights, 0.0), mask=e < E)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize(("scoring", "renormalize", "with_bias"),
                         [("softmax", True, False), ("softmax", False, True), ("sigmoid", True, True)])
@pytest.mark.parametrize(("experts", "top_k"), [(20, 4), (128, 8)])  # one chunk of rivals, and four
def test_route_matches_reference(gen, impl, scoring, renormalize, with_bias, experts, top_k):
    logits = torch.randn(7, experts, generator=gen)
    bias = torch.randn(experts, generator=gen) * 0.1 if with_bias else None
    ids, weights = route(logits, top_k, scoring, renormalize, bias, impl=impl)
    ref_ids, ref_weights = reference.route(logits, top_k, scoring, renormalize, bias)
    assert torch.equal(ids, ref_ids)
    torch.testing.assert_close(weights, ref_weights, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize(("scoring", "renormalize", "with_bias"), [("softmax", True, False), ("sigmoid", False, True)])
def test_expert_gemv_routes_from_the_router_logits_as_the_routing_kernel(gen, impl, scoring, renormalize, with_bias):
    """Given the router's logits instead of ids, each program ranks them itself (no routing launch): the same
    gate/up rows and the same weighted down sum as from `route`'s ids and weights, bit for bit."""
    tokens, e, k, h, i = 2, 40, 6, 48, 32
    x, residual = torch.randn(tokens, h, generator=gen), torch.randn(tokens, h, generator=gen)
    w_gate_up = torch.randn(e, 2 * i, h, generator=gen) * h**-0.5
    w_down = torch.randn(e, h, i, generator=gen) * i**-0.5
    logits = torch.randn(tokens, e, generator=gen)
    bias = torch.randn(e, generator=gen) * 0.1 if with_bias else None
    router = RouterLogits(logits, k, scoring, renormalize, bias)
    ids, weights = route(logits, k, scoring, renormalize, bias, impl=impl)
    outs = []
    for routing, topk_weights in ((router, router), (ids, weights)):
        gate_up = expert_gemv(x, w_gate_up, routing, impl=impl)
        outs.append((gate_up, expert_gemv(gate_up[:, :i], w_down, routing, up=gate_up[:, i:], topk_weights=topk_weights,
                                          residual=residual, settled=True, impl=impl)))
    assert torch.equal(outs[0][0], outs[1][0])
    assert torch.equal(outs[0][1], outs[1][1])


@triton_only
def test_route_kernel_breaks_ties_by_lower_index():
    """Deterministic among equal scores (torch.topk's order among ties is unspecified: on CPU it gave 3, 5, 1, 4)."""
    logits = torch.tensor([[0.0, 2.0, 1.0, 2.0, 1.0, 2.0]])  # three equal best, two equal next
    ids, _ = route(logits, 4, "softmax", True, impl="triton")
    assert ids.tolist() == [[1, 3, 5, 2]]


@triton_only
@pytest.mark.parametrize(("scoring", "with_bias"), [("softmax", False), ("sigmoid", True)])
def test_rank_logits_by_rounds_of_max_ranks_as_the_rank_count(gen, scoring, with_bias):
    """`rank_logits` with CHUNK < 0 (TOP_K rounds of one max over packed keys, `linear_route(route_chunk="max")`)
    picks the experts, ranks and weights the rank count (CHUNK 0) does, bit for bit: on ties (the lower index first),
    negative choosers (a sigmoid's score plus a negative bias), and rows shorter than the block (-inf past E)."""
    experts, top_k = 40, 6
    logits = torch.randn(4, experts, generator=gen)
    logits[1, 3::5] = logits[1, 0]  # ties with the row's first, some among the picks
    logits[2] = logits[2].round()  # many ties
    logits[3] = -10.0  # every score ~0: with the bias, negative choosers
    logits[3, ::7] = 0.0
    bias = torch.full((experts,), -0.5) if with_bias else torch.zeros(experts)
    out = {}
    for chunk in (0, -1):
        ranks, weights = torch.empty(4, experts, dtype=torch.int32), torch.empty(4, experts)
        _ranks_kernel[(4,)](logits, bias, ranks, weights, torch.empty(4 * 64), experts, TOP_K=top_k,
                           SOFTMAX=scoring == "softmax", HAS_BIAS=with_bias, BLOCK_E=64, CHUNK=chunk)
        out[chunk] = ranks, weights
    assert torch.equal(out[0][0], out[-1][0]) and torch.equal(out[0][1], out[-1][1])
    assert ((out[-1][0] >= 0).sum(dim=1) == top_k).all()


def test_group_by_expert_blocks_hold_one_expert_each(gen):
    n, k, e, block = 9, 3, 6, 4
    ids = torch.stack([torch.randperm(e, generator=gen)[:k] for _ in range(n)])
    g = group_by_expert(ids, e, block)
    flat = ids.flatten()
    used = int(g.num_padded)
    pairs = g.sorted_pairs[:used].view(-1, block)
    assert used % block == 0 and used <= g.sorted_pairs.numel()
    real = pairs < n * k
    # every pair appears exactly once, and every real pair of a block belongs to that block's expert
    assert sorted(pairs[real].tolist()) == list(range(n * k))
    experts = g.block_experts[: used // block, None].expand_as(pairs)
    assert torch.equal(flat[pairs[real].long()], experts[real].long())
    assert torch.equal(flat[g.order], torch.sort(flat, stable=True).values)
    assert g.offsets.tolist() == torch.cumsum(torch.bincount(flat, minlength=e), 0).tolist()


def test_grouped_mm_multiplies_each_run_by_its_expert(gen):
    a, w = torch.randn(7, 12, generator=gen), torch.randn(3, 5, 12, generator=gen)
    offsets = torch.tensor([2, 2, 7], dtype=torch.int32)  # expert 1 gets no rows
    expected = torch.cat([a[:2] @ w[0].T, a[2:] @ w[2].T])
    torch.testing.assert_close(grouped_mm(a, w, offsets), expected, rtol=1e-5, atol=1e-5)


def _reference_moe(x, w_gate, w_up, w_down, ids, weights):
    out = torch.zeros_like(x)
    for e in torch.unique(ids).tolist():
        tok, kk = torch.nonzero(ids == e, as_tuple=True)
        y = reference.swiglu(x[tok], w_gate[e], w_up[e], w_down[e])
        out.index_add_(0, tok, y * weights[tok, kk, None])
    return out


@pytest.mark.parametrize("backend", ["loop", "grouped_mm", pytest.param("triton", marks=triton_only)])
@pytest.mark.parametrize("fused", [True, False])
@pytest.mark.parametrize("num_tokens", [1, 11])
def test_moe_experts_backends_match_the_reference_loop(gen, backend, fused, num_tokens):
    e, h, i, k = 8, 32, 24, 2
    x = torch.randn(num_tokens, h, generator=gen)
    w_gate, w_up = torch.randn(e, i, h, generator=gen) * 0.2, torch.randn(e, i, h, generator=gen) * 0.2
    w_down = torch.randn(e, h, i, generator=gen) * 0.2
    ids, weights = reference.route(torch.randn(num_tokens, e, generator=gen), k, "softmax", True)
    gate_up = torch.cat([w_gate, w_up], dim=1) if fused else (w_gate, w_up)
    out = moe_experts(x, gate_up, w_down, ids, weights, backend=backend)
    torch.testing.assert_close(out, _reference_moe(x, w_gate, w_up, w_down, ids, weights), rtol=1e-4, atol=1e-5)


@triton_only
@pytest.mark.parametrize("tokens", [1, 2])
def test_expert_gemv_matches_its_torch_composition(gen, tokens):
    """Gate and up of each token's experts in one launch (ids read on the device), then the down
    projections weighted, summed and added to the residual: Triton against the PyTorch composition."""
    e, k, h, i = 6, 3, 80, 40
    x = torch.randn(tokens, h, generator=gen)
    # scaled as a model's are, so outputs are O(1) and the tolerances below are relative ones in effect
    w_gate, w_up = (torch.randn(e, i, h, generator=gen) * h**-0.5 for _ in range(2))
    w_down = torch.randn(e, h, i, generator=gen) * i**-0.5
    ids = torch.stack([torch.randperm(e, generator=gen)[:k] for _ in range(tokens)])
    weights, residual = torch.rand(tokens, k, generator=gen), torch.randn(tokens, h, generator=gen)
    outs = []
    for impl in ("triton", "torch"):
        gate_up = expert_gemv(x, w_gate, ids, w2=w_up, impl=impl)
        fused = expert_gemv(x, torch.cat([w_gate, w_up], 1), ids, impl=impl)  # one weight: same result
        torch.testing.assert_close(gate_up, fused, rtol=1e-4, atol=1e-4)
        outs.append(expert_gemv(gate_up[:, :i], w_down, ids, up=gate_up[:, i:], topk_weights=weights,
                                residual=residual, impl=impl))
    torch.testing.assert_close(outs[0], outs[1], rtol=1e-4, atol=1e-4)
    loop = moe_experts(x, (w_gate, w_up), w_down, ids, weights, backend="loop")  # the reference's loop
    torch.testing.assert_close(outs[1], loop + residual, rtol=1e-4, atol=1e-4)
    nw = torch.randn(h, generator=gen)
    normed = [expert_gemv(x, w_gate, ids, norm_weight=nw, eps=1e-5, impl=impl) for impl in ("triton", "torch")]
    torch.testing.assert_close(normed[0], normed[1], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(normed[1], expert_gemv(rms_norm(x, nw, 1e-5, impl="torch"), w_gate, ids, impl="torch"))


@triton_only
def test_expert_gemv_prefetch_sums_the_same_bits(gen, monkeypatch):
    """PREFETCH (each next weight tile and input chunk loaded before this tile is summed) changes what is in flight,
    not the sums: gate/up with the norm prologue and down with SiLU-mul, weights and residual, bit for bit, over K
    that ends in a short tile."""
    from athanor.kernels import moe

    e, k, h, i = 6, 3, 80, 40  # K 80 and 40: three and two tiles of 32, the last short
    x = torch.randn(2, h, generator=gen)
    w_gate, w_up = (torch.randn(e, i, h, generator=gen) * h**-0.5 for _ in range(2))
    w_down = torch.randn(e, h, i, generator=gen) * i**-0.5
    ids = torch.stack([torch.randperm(e, generator=gen)[:k] for _ in range(2)])
    weights, nw = torch.rand(2, k, generator=gen), torch.randn(h, generator=gen)
    outs = []
    for prefetch in (0, 1):
        monkeypatch.setitem(moe.INTERPRETED, "PREFETCH", prefetch)
        gate_up = expert_gemv(x, w_gate, ids, w2=w_up, norm_weight=nw, eps=1e-5)
        outs.append((gate_up, expert_gemv(gate_up[:, :i], w_down, ids, up=gate_up[:, i:], topk_weights=weights,
                                          residual=x)))
    for before, after in zip(outs[0], outs[1], strict=True):
        assert torch.equal(before, after)


@triton_only
@pytest.mark.parametrize(("m", "scoring", "with_bias"), [
    (1, "softmax", False),
    # The slow tier's: three rows reach the block in the fused layer's test (tests/unit/moves), a sigmoid with a
    # bias the rank kernel's tests above.
    pytest.param(3, "sigmoid", True, marks=pytest.mark.slow),
])
def test_moe_block_is_linear_route_then_the_expert_gemvs_bit_for_bit(gen, m, scoring, with_bias):
    """The persistent MoE block (its three phases as three launches on the interpreter, three programs walking every
    GEMV's units) against the four launches it stands for: h, logits, ids, weights and the output all the same bits;
    a second call the same again (the sums and counters left zero). And the PyTorch composition within fp32."""
    from athanor.kernels.moe_block import moe_block

    experts, top_k, hidden, k, inter = 24, 4, 96, 200, 48
    x, wo = torch.randn(m, k, generator=gen), torch.randn(hidden, k, generator=gen) / k**0.5
    residual, nw = torch.randn(m, hidden, generator=gen), torch.randn(hidden, generator=gen)
    router_w = torch.randn(experts, hidden, generator=gen)
    sel = torch.randn(experts, generator=gen) * 0.1 if with_bias else None
    w_gate, w_up = (torch.randn(experts, inter, hidden, generator=gen) / hidden**0.5 for _ in range(2))
    w_down = torch.randn(experts, hidden, inter, generator=gen) / inter**0.5
    call = (x, wo, residual, router_w, nw, 1e-5, top_k, scoring, True, sel, w_gate, w_up, w_down)
    first, again = moe_block(*call), moe_block(*call)
    h, logits, ids, weights = linear_route(*call[:10])
    out = routed_experts(h, w_gate, w_up, w_down, ids, weights, nw, 1e-5)
    for name, four in zip(("out", "h", "logits", "ids", "weights"), (out, h, logits, ids, weights), strict=True):
        assert torch.equal(getattr(first, name), getattr(again, name)), name
        assert torch.equal(getattr(first, name), four), name
    torch_out = moe_block(*call, impl="torch")
    assert torch.equal(first.ids, torch_out.ids)
    torch.testing.assert_close(first.out, torch_out.out, rtol=1e-4, atol=1e-4)


def test_moe_block_config_refuses_what_triton_cannot_launch():
    """The persistent block's launch config: blocks are powers of two (rank_chunk may be 0), the rest positive; a bad
    field is a one-line error naming it."""
    assert MoeBlockConfig(rank_chunk=0, block_k1=2048, per_sm=3).per_sm == 3
    for field, value in (("block_n1", 6), ("rank_chunk", 12), ("per_sm", 0), ("num_warps", -1)):
        with pytest.raises(ConfigError, match=f"MoeBlockConfig.{field}"):
            MoeBlockConfig(**{field: value})
