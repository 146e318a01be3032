"""Triton kernels vs their PyTorch fallbacks on a GPU, in bf16 at model-sized shapes.

Run on a lent GPU (`pytest -m gpu tests/gpu`). Timings are printed for the record, not asserted.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

BF16 = {"rtol": 2e-2, "atol": 2e-2}


def _ms(fn, iters: int = 20) -> float:
    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / iters


@pytest.fixture
def dev() -> torch.device:
    torch.manual_seed(int.from_bytes(__import__("os").urandom(4), "little"))
    return torch.device("cuda")


def test_rms_norm_and_silu_mul_bf16(dev):
    from athanor.kernels import add_rms_norm, silu_mul

    x, r = torch.randn(32, 4096, device=dev, dtype=torch.bfloat16), torch.randn(32, 4096, device=dev,
                                                                                   dtype=torch.bfloat16)
    w = torch.randn(4096, device=dev, dtype=torch.bfloat16)
    for a, b in zip(add_rms_norm(x, r, w, 1e-5, impl="triton"), add_rms_norm(x, r, w, 1e-5, impl="torch")):
        torch.testing.assert_close(a, b, **BF16)
    gu = torch.randn(32, 2 * 14336, device=dev, dtype=torch.bfloat16)
    torch.testing.assert_close(silu_mul(gu[:, :14336], gu[:, 14336:], impl="triton"),
                               silu_mul(gu[:, :14336], gu[:, 14336:], impl="torch"), **BF16)


@pytest.mark.parametrize(("batch", "context"), [(1, 1024), (1, 32768), (8, 8192), (64, 2048)])
def test_decode_attention_bf16_long_context(dev, batch, context):
    from athanor.kernels import decode_attention

    hq, hkv, d = 32, 8, 128
    max_len = context + 16
    q = torch.randn(batch, hq, d, device=dev, dtype=torch.bfloat16)
    k_cache = torch.randn(batch + 1, hkv, max_len, d, device=dev, dtype=torch.bfloat16)
    v_cache = torch.randn_like(k_cache)
    slots = torch.arange(batch, device=dev)
    kv_lens = torch.randint(1, context + 1, (batch,), device=dev)
    kv_lens[0] = context
    out = decode_attention(q, k_cache, v_cache, slots, kv_lens, impl="triton")
    torch.testing.assert_close(out, decode_attention(q, k_cache, v_cache, slots, kv_lens, impl="torch"), **BF16)
    ms = _ms(lambda: decode_attention(q, k_cache, v_cache, slots, kv_lens, impl="triton"))
    kv_bytes = 2 * int(kv_lens.sum()) * hkv * d * 2
    print(f"attention b={batch} ctx={context}: {ms:.3f} ms, {kv_bytes / ms / 1e6:.0f} GB/s")


def test_decode_attention_is_graph_capturable(dev):
    from athanor.kernels import decode_attention

    q = torch.randn(4, 32, 128, device=dev, dtype=torch.bfloat16)
    k_cache = torch.randn(5, 8, 4096, 128, device=dev, dtype=torch.bfloat16)
    v_cache = torch.randn_like(k_cache)
    slots = torch.arange(4, device=dev)
    kv_lens = torch.tensor([1, 100, 1000, 4096], device=dev)
    decode_attention(q, k_cache, v_cache, slots, kv_lens)  # compile outside capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = decode_attention(q, k_cache, v_cache, slots, kv_lens)
    kv_lens.copy_(torch.tensor([4096, 3, 2000, 1], device=dev))  # new lengths, same graph
    graph.replay()
    torch.testing.assert_close(out, decode_attention(q, k_cache, v_cache, slots, kv_lens, impl="torch"), **BF16)


@pytest.mark.parametrize("m", [1, 4, 16])
@pytest.mark.parametrize(("n", "k"), [(2048, 2048), (6144, 4096), (4096, 14336)])
def test_splitk_linear_bf16_vs_cublas(dev, m, n, k):
    from athanor.kernels import splitk_linear

    x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
    w = torch.randn(n, k, device=dev, dtype=torch.bfloat16) * k**-0.5
    torch.testing.assert_close(splitk_linear(x, w, impl="triton"), F.linear(x, w), **BF16)
    ours, cublas = _ms(lambda: splitk_linear(x, w, impl="triton")), _ms(lambda: F.linear(x, w))
    print(f"gemv m={m} n={n} k={k}: split-K {ours:.4f} ms, cuBLAS {cublas:.4f} ms")


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
    ref = moe_experts(x, (w_gate, w_up), w_down, ids, weights, backend="loop")
    out = moe_experts(x, (w_gate, w_up), w_down, ids, weights, backend=backend)
    torch.testing.assert_close(out, ref, **BF16)
    print(f"moe {backend} n={num_tokens}: {_ms(lambda: moe_experts(x, (w_gate, w_up), w_down, ids, weights, backend=backend)):.3f} ms")


def test_route_rope_and_greedy_bf16(dev):
    from athanor.kernels import greedy, rope_and_cache, route

    logits = torch.randn(64, 128, device=dev, dtype=torch.bfloat16)
    a, b = route(logits, 8, "softmax", True, impl="triton"), route(logits, 8, "softmax", True, impl="torch")
    assert (a[0] == b[0]).float().mean() > 0.99  # bf16 ties may order differently
    q, k, v = (torch.randn(8, h, 128, device=dev, dtype=torch.bfloat16) for h in (32, 8, 8))
    cos, sin = torch.randn(512, 128, device=dev, dtype=torch.bfloat16), torch.randn(512, 128, device=dev,
                                                                                     dtype=torch.bfloat16)
    pos, slots = torch.randint(0, 512, (8,), device=dev), torch.randperm(9, device=dev)[:8]
    caches = [torch.zeros(9, 8, 512, 128, device=dev, dtype=torch.bfloat16) for _ in range(4)]
    qa = rope_and_cache(q, k, v, cos, sin, pos, slots, caches[0], caches[1], impl="triton")
    qb = rope_and_cache(q, k, v, cos, sin, pos, slots, caches[2], caches[3], impl="torch")
    torch.testing.assert_close(qa, qb, **BF16)
    torch.testing.assert_close(caches[0], caches[2], **BF16)
    big = torch.randn(16, 128256, device=dev)
    assert torch.equal(greedy(big, impl="triton"), big.argmax(-1))


@pytest.mark.parametrize("preset", ["llama-3.2-1b", "qwen3-30b-a3b"])
def test_best_candidate_matches_reference_in_bf16(dev, preset, tmp_path):
    """Two layers of the real shapes: the best-known render's logits against the reference's."""
    import importlib.util

    from athanor.model import BuildContext, DecodeBatch, make_prefill_batch
    from athanor.model.presets import PRESETS
    from athanor.model.random_init import random_model
    from athanor.model.reference import build as build_reference
    from athanor.moves import best_candidate

    model = random_model(PRESETS[preset].with_layers(2), device=dev, dtype=torch.bfloat16)
    path = tmp_path / "best.py"
    path.write_text(best_candidate(model.spec))
    spec = importlib.util.spec_from_file_location("best_candidate_gpu", path)
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    outs = []
    for build in (module.build, build_reference):
        fwd = build(model, BuildContext(dev, torch.bfloat16, max_seqs=4, max_seq_len=256))
        prompts = [[(7 * i + j) % 1000 for j in range(n)] for i, n in enumerate((5, 100, 33))]
        fwd.prefill(make_prefill_batch(prompts, [0, 1, 2], device=dev))
        pos = torch.tensor([5, 100, 33], device=dev)
        outs.append(fwd.decode(DecodeBatch(torch.tensor([1, 2, 3], device=dev), pos, torch.tensor([0, 1, 2], device=dev),
                                           pos)).float())
    torch.testing.assert_close(outs[0], outs[1], rtol=5e-2, atol=5e-2)
