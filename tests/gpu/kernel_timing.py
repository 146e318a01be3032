"""What the GPU kernel tests share: bf16 tolerances, relative error, and CUDA-event timings (printed, not asserted)."""

from __future__ import annotations

import torch

BF16 = {"rtol": 2e-2, "atol": 2e-2}


def rel_err(x: torch.Tensor, truth: torch.Tensor) -> float:
    """||x - truth|| / ||truth||, in fp64."""
    return float((x.double() - truth.double()).norm() / truth.double().norm())


def time_ms(fn, iters: int = 20) -> float:
    """ms per call of `fn`, from CUDA events around `iters` calls (after one untimed)."""
    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / iters


def graph_time_ms(fn, iters: int = 20) -> float:
    """ms per call of `fn` replayed from a CUDA graph of `iters` calls (no host launch cost: decode's case)."""
    fn()  # autotuning and lazy init outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(iters):
            fn()
    graph.replay()
    return time_ms(graph.replay, 5) / iters
