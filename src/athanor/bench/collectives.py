"""`athanor bench collectives`: the collectives a layout waits on, measured on this machine: all-reduce, all-gather
and all-to-all over `ranks` processes (NCCL on GPUs, gloo on the CPU), at message sizes from a decode step's
activations to a prefill's. The record fits the plan's link model (`athanor.plan.cost`: a collective of B bytes over
R ranks takes B x its bus factor / bandwidth + (R - 1) x latency) to the all-reduces, and `athanor plan --calibrate
RECORD` uses that bandwidth and latency in place of the hardware description's.
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch

from athanor.bench.record import default_device, provenance
from athanor.errors import ConfigError

DEFAULT_SIZES = (4096, 65536, 1 << 20, 16 << 20)
"""Bytes per rank: a decode step's activations at batch 1-8 to a prefill chunk's (`--sizes` unless given)."""


def bus_factor(op: str, ranks: int) -> float:
    """The bytes over the link per byte of message, as the plan counts them: a ring all-reduce's bus bandwidth
    already includes its 2 (R - 1) / R; an all-gather or all-to-all sends the (R - 1) / R a rank does not keep."""
    return 1.0 if op == "all_reduce" else (ranks - 1) / ranks


def _rank(rank: int, ranks: int, device: str, sizes: tuple[int, ...], iters: int, rendezvous: str, out: str) -> None:
    import torch.distributed as dist

    torch.set_num_threads(1)
    cuda = device.startswith("cuda")
    if cuda:
        torch.cuda.set_device(rank)
    dist.init_process_group("nccl" if cuda else "gloo", init_method=f"file://{rendezvous}", rank=rank,
                            world_size=ranks)
    dev = torch.device(f"cuda:{rank}" if cuda else "cpu")
    times: dict[str, list[float]] = {}
    try:
        for size in sizes:
            n = max(ranks, size // 4 // ranks * ranks)  # fp32 elements, a multiple of the ranks
            x = torch.ones(n, device=dev)
            parts = [torch.empty(n, device=dev) for _ in range(ranks)]
            calls = {"all_reduce": partial(dist.all_reduce, x), "all_gather": partial(dist.all_gather, parts, x),
                     "all_to_all": partial(dist.all_to_all_single, torch.empty_like(x), x)}
            for op, call in calls.items():
                try:
                    call()  # the first call sets up the communicator's buffers
                except RuntimeError:  # a backend without this collective (gloo's all-to-all in some builds)
                    continue
                seconds = []
                for _ in range(iters):
                    dist.barrier()
                    if cuda:
                        torch.cuda.synchronize(dev)
                    t = time.perf_counter()
                    call()
                    if cuda:
                        torch.cuda.synchronize(dev)
                    seconds.append(time.perf_counter() - t)
                times[f"{op}:{n * 4}"] = seconds
        if rank == 0:
            torch.save(times, out)
    finally:
        dist.destroy_process_group()


def fit_link(cells: list[dict[str, Any]]) -> dict[str, float]:
    """The plan's link bandwidth (bytes/s) and per-rank latency (s) that best explain the all-reduce cells' median
    times (least squares on t = bytes / bandwidth + (ranks - 1) x latency)."""
    rows = [c for c in cells if c["op"] == "all_reduce"]
    if len(rows) < 2:
        raise ConfigError("collectives: at least two all-reduce sizes are needed to fit a link")
    a = np.array([[c["bytes"] * bus_factor(c["op"], c["ranks"]), c["ranks"] - 1] for c in rows], dtype=float)
    t = np.array([c["median_s"] for c in rows])
    (inv_bw, latency), *_ = np.linalg.lstsq(a, t, rcond=None)
    return {"link_bytes_s": float(1 / inv_bw) if inv_bw > 0 else float("inf"), "link_latency_s": max(0.0, float(latency))}


def bench_collectives(ranks: int = 2, device: str | None = None, sizes: tuple[int, ...] = (),
                      iters: int = 20) -> dict[str, Any]:
    """Time each collective at each size (default `DEFAULT_SIZES`) over `ranks` processes of this machine; the record,
    with its fitted link."""
    import torch.multiprocessing as mp

    sizes = sizes or DEFAULT_SIZES
    device = default_device(device)
    if ranks < 2:
        raise ConfigError(f"--ranks {ranks}: a collective needs at least 2")
    if device.startswith("cuda") and torch.cuda.device_count() < ranks:
        raise ConfigError(f"--ranks {ranks}: this machine has {torch.cuda.device_count()} GPU(s)")
    if any(s < 4 for s in sizes) or iters < 1:
        raise ConfigError("--sizes must be at least 4 bytes each and --iters at least 1")
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")  # one machine: the ranks talk over loopback
    with tempfile.TemporaryDirectory() as tmp:
        out = str(Path(tmp) / "times.pt")
        mp.start_processes(_rank, args=(ranks, device, tuple(sizes), iters, str(Path(tmp) / "rendezvous"), out),
                           nprocs=ranks, join=True, start_method="spawn")
        times: dict[str, list[float]] = torch.load(out)
    cells = []
    for key, seconds in times.items():
        op, size = key.split(":")
        median = statistics.median(seconds)
        cells.append({"op": op, "bytes": int(size), "ranks": ranks, "median_s": median, "min_s": min(seconds),
                      "bus_bytes_s": int(size) * bus_factor(op, ranks) / median})
    return {"benchmark": "collectives", "ranks": ranks, "iters": iters, "cells": cells, "link": fit_link(cells),
            **provenance(device)}


def summary_lines(record: dict[str, Any]) -> list[str]:
    lines = [f"{c['op']:<11}{c['bytes']:>12,} B  {1e6 * c['median_s']:>10.1f} us  {c['bus_bytes_s'] / 1e9:>8.2f} GB/s"
             for c in record["cells"]]
    link = record["link"]
    lines.append(f"{record['ranks']} ranks on {record['device_name']}: link {link['link_bytes_s'] / 1e9:.2f} GB/s, "
                 f"{1e6 * link['link_latency_s']:.1f} us per rank (the plan's model, fitted to the all-reduces)")
    return lines
