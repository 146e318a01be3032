"""What the GPU kernel tests share: bf16 tolerances, relative error, and CUDA-event timings (printed, not asserted)."""

from __future__ import annotations

import torch

from athanor.bench.timing import time_steps

BF16 = {"rtol": 2e-2, "atol": 2e-2}


def rel_err(x: torch.Tensor, truth: torch.Tensor) -> float:
    """||x - truth|| / ||truth||, in fp64."""
    return float((x.double() - truth.double()).norm() / truth.double().norm())


def time_ms(fn, iters: int = 20) -> float:
    """ms per call of `fn`, from CUDA events around `iters` calls (after three untimed): the decode benchmark's timer."""
    return 1e3 * time_steps(fn, torch.device("cuda", torch.cuda.current_device()), iters, 0.0)


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
