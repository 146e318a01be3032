"""The decode benchmark's clock and its roofline: step time on device events, bytes a step must read, and the
device's copy bandwidth that prices them."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch

from athanor.model import Model

_bandwidth_cache: dict[str, float] = {}


def copy_bandwidth(device: torch.device, nbytes: int = 2 << 30, iters: int = 10) -> float:
    """Bytes/s moved by a large device-to-device copy (read + write counted), measured once per device."""
    key = str(device)
    if key not in _bandwidth_cache:
        src = torch.empty(nbytes, dtype=torch.uint8, device=device)
        dst = torch.empty_like(src)
        dst.copy_(src)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iters):
            dst.copy_(src)
        end.record()
        end.synchronize()
        _bandwidth_cache[key] = 2 * nbytes * iters / (start.elapsed_time(end) / 1000)
        del src, dst
        torch.cuda.empty_cache()
    return _bandwidth_cache[key]


def step_bytes(model: Model, batch: int, context: int, distinct_experts: float | None = None) -> dict[str, int]:
    """Bytes one decode step must read: weights (embedding rows aside; of an MoE layer's experts, the distinct ones
    the batch activates) and the KV of `context` tokens per row."""
    spec = model.spec
    itemsize = model.dtype.itemsize
    weights = 0
    for name, t in model.weights.items():
        if name == "embed" and not spec.tie_embeddings:
            weights += batch * t.shape[1] * itemsize  # only the looked-up rows
        elif ".experts." in name and spec.moe is not None:
            used = distinct_experts if distinct_experts is not None else min(spec.moe.num_experts,
                                                                               batch * spec.moe.top_k)
            weights += int(t.numel() * itemsize * used / spec.moe.num_experts)
        else:
            weights += t.numel() * itemsize
    kv = 2 * spec.num_layers * batch * spec.num_kv_heads * context * spec.head_dim * itemsize
    return {"weight_bytes": weights, "kv_bytes": kv, "total_bytes": weights + kv}


def time_steps(step: Callable[[], Any], dev: torch.device, iters: int, min_time_s: float) -> float:
    """Seconds per step over at least `iters` back-to-back steps (and, on CUDA, at least `min_time_s`).

    On CUDA the steps are timed on device events without a host sync between them, as a server that queues its
    next step before reading the last one's tokens runs them."""
    for _ in range(3):
        step()
    if dev.type != "cuda":
        t = time.perf_counter()
        for _ in range(iters):
            step()
        return (time.perf_counter() - t) / iters
    torch.cuda.synchronize(dev)
    t = time.perf_counter()
    step()
    torch.cuda.synchronize(dev)
    once = max(time.perf_counter() - t, 1e-6)
    n = max(iters, min(2000, int(min_time_s / once)))
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(n):
        step()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / 1000 / n
