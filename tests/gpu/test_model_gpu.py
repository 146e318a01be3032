"""The model core on CUDA: loaders, the reference forward in bf16 against fp32, graph capture of decode."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from athanor.model import BuildContext, DecodeBatch, make_prefill_batch
from athanor.model.hf import save_hf
from athanor.model.presets import get_preset
from athanor.model.random_init import random_model
from athanor.model.reference import build
from athanor.model.registry import load_model

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]
CUDA = torch.device("cuda")


def _rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm())


@pytest.mark.parametrize("preset", ["tiny-dense", "tiny-moe", "llama-3.2-1b"])
def test_bf16_on_gpu_tracks_fp32_on_cpu(preset: str) -> None:
    cpu = random_model(get_preset(preset), seed=1)
    if cpu.spec.num_layers > 4:
        cpu = cpu.slice(4)
    gpu = cpu.to(CUDA, torch.bfloat16)
    prompts = [list(range(3, 40)), list(range(50, 61))]
    want = build(cpu, BuildContext(torch.device("cpu"), torch.float32, 2, 64)).prefill(make_prefill_batch(prompts, [0, 1]))
    got = build(gpu, BuildContext(CUDA, torch.bfloat16, 2, 64)).prefill(make_prefill_batch(prompts, [0, 1], device=CUDA))
    assert got.dtype == torch.bfloat16 and torch.isfinite(got).all()
    assert _rel_err(got.cpu(), want) < 3e-2


def test_captured_decode_equals_eager_decode() -> None:
    model = random_model(get_preset("llama-3.2-1b").with_layers(2), seed=2, device=CUDA, dtype=torch.bfloat16)
    ctx = BuildContext(CUDA, torch.bfloat16, max_seqs=4, max_seq_len=256)
    fwd = build(model, ctx)
    assert fwd.graph_safe
    prompts = [list(range(10, 30)), list(range(5, 12)), list(range(90, 140))]
    fwd.prefill(make_prefill_batch(prompts, [0, 1, 2], device=CUDA))
    lens = torch.tensor([len(p) for p in prompts], device=CUDA)
    batch = DecodeBatch(torch.tensor([1, 2, 3], device=CUDA), lens.clone(), torch.tensor([0, 1, 2], device=CUDA),
                        lens.clone())
    eager = fwd.decode(batch).clone()
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fwd.decode(batch)  # warm-up on the side stream, as capture requires
    torch.cuda.current_stream().wait_stream(stream)
    with torch.cuda.graph(graph):
        out = fwd.decode(batch)
    graph.replay()
    torch.cuda.synchronize()
    # The captured step attends over the whole cache with a mask; same numbers up to bf16 reduction order.
    assert _rel_err(out, eager) < 1e-2
    assert torch.equal(out.argmax(-1), eager.argmax(-1))


def test_hf_directory_loads_onto_the_gpu(tmp_path: Path) -> None:
    model = random_model(get_preset("tiny-moe"), seed=3, dtype=torch.bfloat16)
    save_hf(model, tmp_path)
    back = load_model(str(tmp_path), device="cuda")
    assert back.device.type == "cuda" and back.dtype == torch.bfloat16
    assert all(torch.equal(back.weights[n].cpu(), t) for n, t in model.weights.items())
