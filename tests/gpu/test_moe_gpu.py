"""The MoE kernels vs their PyTorch fallbacks or their unfused launches on a GPU, in bf16 at qwen3-30b-a3b's and
Mixtral's shapes: the expert backends, the router with its top-k, the O projection summing the router's logits, the
expert GEMVs routing themselves, the persistent MoE block.

Run on a lent GPU (`pytest -m gpu tests/gpu`). Timings are printed for the record, not asserted.
"""

from __future__ import annotations

import pytest
import torch
from kernel_timing import BF16, rel_err, time_ms

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


@pytest.mark.parametrize("num_tokens", [1, 32, 128])
@pytest.mark.parametrize("backend", ["triton", "grouped_mm"])
def test_moe_experts_bf16(dev, num_tokens, backend):
    from athanor.kernels import has_grouped_mm, moe_experts, route

    if backend == "grouped_mm" and not has_grouped_mm():
        pytest.skip("this torch has no torch._grouped_mm")
    e, h, i, top_k = 128, 2048, 768, 8
    x = torch.randn(num_tokens, h, device=dev, dtype=torch.bfloat16)
    w_gate = torch.randn(e, i, h, device=dev, dtype=torch.bfloat16) * h**-0.5
    w_up, w_down = torch.randn_like(w_gate), torch.randn(e, h, i, device=dev, dtype=torch.bfloat16) * i**-0.5
    ids, weights = route(torch.randn(num_tokens, e, device=dev), top_k, "softmax", True)
    # Judged against an fp32 truth, not element-wise against the bf16 loop: the loop rounds each
    # expert's output, its weight and every index_add_ partial sum to bf16, so it is the *least*
    # accurate of the three (tests/unit/kernels/test_bf16_kernels.py reproduces this on CPU).
    truth = moe_experts(x.float(), (w_gate.float(), w_up.float()), w_down.float(), ids, weights, backend="loop")
    loop = moe_experts(x, (w_gate, w_up), w_down, ids, weights, backend="loop")
    out = moe_experts(x, (w_gate, w_up), w_down, ids, weights, backend=backend)
    assert rel_err(out, truth) <= 1.5 * rel_err(loop, truth), (rel_err(out, truth), rel_err(loop, truth))
    assert rel_err(out, truth) < 1e-2
    print(f"moe {backend} n={num_tokens}: {time_ms(lambda: moe_experts(x, (w_gate, w_up), w_down, ids, weights, backend=backend)):.3f} ms")


def test_router_topk_bf16_in_a_graph(dev):
    """The top-k inside the router GEMV (qwen3-30b-a3b: 128 experts, top 8), captured and replayed: the ids are a
    top-8 of the fp32 truth up to bf16 rounding, the weights its renormalised softmax."""
    from athanor.kernels import fused_linear, route, router_topk

    bf = {"device": dev, "dtype": torch.bfloat16}
    h, w, nw = torch.randn(1, 2048, **bf), torch.randn(128, 2048, **bf) / 2048**0.5, torch.randn(2048, **bf)
    router_topk(h, w, nw, 1e-6, 8, "softmax", True)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        ids, weights = router_topk(h, w, nw, 1e-6, 8, "softmax", True)
    for _ in range(5):
        h.copy_(torch.randn_like(h))
        graph.replay()
        x = h.float()
        logits = (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * nw.float()) @ w.float().T
        kth = logits.topk(8).values[:, -1:]
        chosen = logits.gather(1, ids)
        assert ids.unique().numel() == 8 and bool((chosen >= kth - 0.02 * logits.std()).all())
        torch.testing.assert_close(weights, torch.softmax(chosen, -1), **BF16)
    route(fused_linear(h, w, norm_weight=nw, eps=1e-6), 8, "softmax", True)  # autotune outside the capture
    two = torch.cuda.CUDAGraph()
    with torch.cuda.graph(two):
        route(fused_linear(h, w, norm_weight=nw, eps=1e-6), 8, "softmax", True)
    print(f"router_topk 128x2048 top 8: {time_ms(graph.replay) * 1e3:.1f} us, GEMV + route kernel {time_ms(two.replay) * 1e3:.1f} us")


def test_linear_route_bf16_in_a_graph(dev):
    """The O projection summing the router's logits (qwen3-30b-a3b: 4096 -> 2048, 128 experts, top 8), captured and
    replayed with new inputs: h is `fused_linear`'s within bf16 rounding, the logits the router GEMV's within bf16 rounding, the ids a top-8
    of them up to that rounding; replays give the same bits (the fixed-point sums are order-free)."""
    from athanor.kernels import fused_linear, linear_route, route

    bf = {"device": dev, "dtype": torch.bfloat16}
    x, w, residual = torch.randn(1, 4096, **bf), torch.randn(2048, 4096, **bf) / 64, torch.randn(1, 2048, **bf)
    router_w, nw = torch.randn(128, 2048, **bf) / 2048**0.5, torch.randn(2048, **bf)

    def both() -> tuple[torch.Tensor, ...]:
        return linear_route(x, w, residual, router_w, nw, 1e-6, 8, "softmax", True)

    def three() -> tuple[torch.Tensor, ...]:
        h = fused_linear(x, w, residual=residual)
        return route(fused_linear(h, router_w, norm_weight=nw, eps=1e-6), 8, "softmax", True)

    both(), three()  # autotune outside the capture
    graph, two = torch.cuda.CUDAGraph(), torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        h, logits, ids, weights = both()
    with torch.cuda.graph(two):
        three()
    for _ in range(5):
        x.copy_(torch.randn_like(x))
        graph.replay()
        first = [t.clone() for t in (h, logits, ids, weights)]
        graph.replay()
        assert all(torch.equal(a, b) for a, b in zip(first, (h, logits, ids, weights), strict=True))
        torch.testing.assert_close(h, fused_linear(x, w, residual=residual), **BF16)  # tuned apart: other sums
        ref = fused_linear(h, router_w, norm_weight=nw, eps=1e-6).float()
        torch.testing.assert_close(logits.float(), ref, **BF16)
        kth = ref.topk(8).values[:, -1:]
        assert ids.unique().numel() == 8 and bool((ref.gather(1, ids) >= kth - 0.02 * ref.std()).all())
        torch.testing.assert_close(weights, torch.softmax(logits.float().gather(1, ids), -1), **BF16)
    print(f"linear_route 2048x4096 + router 128 top 8: {time_ms(graph.replay) * 1e3:.1f} us, "
          f"O GEMV + router GEMV + route kernel {time_ms(two.replay) * 1e3:.1f} us")


def test_expert_gemv_routes_itself_bf16_in_a_graph(dev):
    """The expert GEMVs ranking the router's logits themselves (qwen3-30b-a3b: 128 experts, top 8, 2048 -> 768),
    captured and replayed with new logits: the gate/up rows and the weighted down sum of the routing kernel's ids and
    weights, within bf16 rounding (the two launches are tuned apart, and another BLOCK_K sums in another order; a
    wrong expert's row would differ by its whole size)."""
    from athanor.kernels import RouterLogits, expert_gemv, route

    bf = {"device": dev, "dtype": torch.bfloat16}
    e, k, h, i = 128, 8, 2048, 768
    x, residual = torch.randn(1, h, **bf), torch.randn(1, h, **bf)
    w_gate_up, w_down = torch.randn(e, 2 * i, h, **bf) / h**0.5, torch.randn(e, h, i, **bf) / i**0.5
    logits = torch.randn(1, e, **bf)
    router = RouterLogits(logits, k, "softmax", True)

    def moe(routed: bool) -> tuple[torch.Tensor, torch.Tensor]:
        ids, weights = (router, router) if routed else route(logits, k, "softmax", True)
        gate_up = expert_gemv(x, w_gate_up, ids)
        return gate_up, expert_gemv(gate_up[:, :i], w_down, ids, up=gate_up[:, i:], topk_weights=weights,
                                    residual=residual, settled=True)

    for routed in (True, False):  # autotune outside the capture
        moe(routed)
    graphs = [torch.cuda.CUDAGraph() for _ in range(2)]
    outs = []
    for graph, routed in zip(graphs, (True, False), strict=True):
        with torch.cuda.graph(graph):
            outs.append(moe(routed))
    for _ in range(3):
        logits.copy_(torch.randn_like(logits))
        for graph in graphs:
            graph.replay()
        torch.testing.assert_close(outs[0][0], outs[1][0], **BF16)
        torch.testing.assert_close(outs[0][1], outs[1][1], **BF16)
    print(f"expert_gemv routing itself: {time_ms(graphs[0].replay) * 1e3:.1f} us, route kernel + expert_gemv "
          f"{time_ms(graphs[1].replay) * 1e3:.1f} us")


@pytest.mark.parametrize("rows", [1, 3])
def test_moe_block_bf16_in_a_graph(dev, rows):
    """The persistent MoE block (qwen3-30b-a3b: O 4096 -> 2048, 128 experts, top 8, 2048 -> 768 -> 2048), captured and
    replayed with new inputs, against `linear_route` and the two `expert_gemv` calls: h and the output within bf16
    rounding (other blocks), the ids theirs but for near ties, and the routing of the block's own h (`linear_route` on
    a zero input with h as the residual) the same bits (order-free sums); replays the same bits; no program gave up
    waiting (every one resident at once)."""
    from athanor.kernels import linear_route, moe_block, routed_experts
    from athanor.kernels.dispatch import _zeroed

    bf = {"device": dev, "dtype": torch.bfloat16}
    e, top_k, hidden, k, inter = 128, 8, 2048, 4096, 768
    x, wo, residual = torch.randn(rows, k, **bf), torch.randn(hidden, k, **bf) / 64, torch.randn(rows, hidden, **bf)
    router_w, nw = torch.randn(e, hidden, **bf) / hidden**0.5, torch.randn(hidden, **bf)
    w_gate, w_up = (torch.randn(e, inter, hidden, **bf) / hidden**0.5 for _ in range(2))
    w_down = torch.randn(e, hidden, inter, **bf) / inter**0.5
    call = (x, wo, residual, router_w, nw, 1e-6, top_k, "softmax", True, None, w_gate, w_up, w_down)

    def four() -> tuple[torch.Tensor, ...]:
        h, logits, ids, weights = linear_route(*call[:10])
        return routed_experts(h, w_gate, w_up, w_down, ids, weights, nw, 1e-6), h, logits, ids, weights

    moe_block(*call), four()  # compile and tune outside the capture
    graph, two = torch.cuda.CUDAGraph(), torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        block = moe_block(*call)
    with torch.cuda.graph(two):
        four()
    got = (block.out, block.h, block.logits, block.ids, block.weights)
    for _ in range(4):
        x.copy_(torch.randn_like(x))
        graph.replay()
        first = [t.clone() for t in got]
        graph.replay()
        assert all(torch.equal(a, b) for a, b in zip(first, got, strict=True))
        ref = four()
        # Other blocks than the four launches' pins or picks (the O projection without split-K, 1024-wide tiles): h is
        # summed in another order, so the logits and a near tie may differ; the routing is theirs where h is.
        torch.testing.assert_close(block.h, ref[1], **BF16)
        assert (block.ids.sort(1).values == ref[3].sort(1).values).float().mean() > 0.9
        assert rel_err(block.out, ref[0]) < 5e-2
        routed = linear_route(torch.zeros_like(x), wo, block.h, *call[3:10])  # h + 0: the block's own h, routed
        for name, a, b in zip(("h", "logits", "ids", "weights"), routed, got[1:], strict=True):
            assert torch.equal(a, b), name
    assert int(_zeroed("moe_block_barrier", dev, 4, torch.int32)[2]) == 0, "a program gave up at a grid barrier"
    print(f"moe_block rows {rows}: {time_ms(graph.replay) * 1e3:.1f} us, the four launches {time_ms(two.replay) * 1e3:.1f} us")
