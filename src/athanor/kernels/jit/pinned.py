"""Configs of the fused-GEMV kernels chosen in the whole decode step, per GPU, for the preset models' batch-1 shapes.

Triton's autotuner times each config of a kernel alone, a few microseconds a launch, and its picks move from one
process to the next, some of them far slower in the step. Alone, a kernel neither waits on the one before nor shares
the SMs with the next one's resident programs, as it does under PDL in the step. So a shape listed here for the GPU
at hand, in bf16, launches with its config, as vLLM ships tuned MoE configs per GPU; every other shape, dtype or GPU
is autotuned. The configs are the fastest whole step among the autotuner's own (`LAUNCHED` names the shapes to tune).

Keys are the autotuner's own (`tuned.keys`: M, N, K, then the kernel's flags, PDL and EARLY last); values
(meta-parameters, num_warps, num_stages).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch

Pin = tuple[dict[str, int], int, int]

PINNED: dict[str, dict[str, dict[tuple[Any, ...], Pin]]] = {
    "NVIDIA H200": {
        "fused_gemv_kernel": {
            (1, 5120, 2048, True, False, False, True, True): ({'BLOCK_N': 8, 'BLOCK_K': 1024, 'SPLIT_K': 1}, 4, 2),
            (1, 2048, 4096, False, False, True, True, True): ({'BLOCK_N': 8, 'BLOCK_K': 512, 'SPLIT_K': 4}, 4, 3),
            (1, 128, 2048, True, False, False, True, True): ({'BLOCK_N': 8, 'BLOCK_K': 512, 'SPLIT_K': 4}, 4, 3),
            (1, 2048, 2048, False, False, True, True, True): ({'BLOCK_N': 8, 'BLOCK_K': 1024, 'SPLIT_K': 1}, 4, 2),
            (1, 16384, 2048, True, False, False, True, True): ({'BLOCK_N': 16, 'BLOCK_K': 256, 'SPLIT_K': 1}, 4, 4),
            (1, 2048, 8192, False, True, True, True, True): ({'BLOCK_N': 8, 'BLOCK_K': 512, 'SPLIT_K': 4}, 4, 3),
            (1, 4096, 4096, False, False, True, True, True): ({'BLOCK_N': 8, 'BLOCK_K': 1024, 'SPLIT_K': 1}, 4, 2),
            (1, 28672, 4096, True, False, False, True, True): ({'BLOCK_N': 4, 'BLOCK_K': 1024, 'SPLIT_K': 1}, 4, 3),
            (1, 4096, 14336, False, True, True, True, True): ({'BLOCK_N': 32, 'BLOCK_K': 256, 'SPLIT_K': 4}, 4, 3),
            # The LM heads with the final norm inside (lm_head=triton_fused)
            (1, 151936, 2048, True, False, False, True, True): ({'BLOCK_N': 8, 'BLOCK_K': 2048, 'SPLIT_K': 1}, 4, 1),
            (1, 128256, 2048, True, False, False, True, True): ({'BLOCK_N': 8, 'BLOCK_K': 1024, 'SPLIT_K': 1}, 4, 2),
            (1, 128256, 4096, True, False, False, True, True): ({'BLOCK_N': 4, 'BLOCK_K': 4096, 'SPLIT_K': 1}, 4, 1),
        },
        "fused_gemv_argmax_kernel": {  # the same LM heads with the greedy argmax folded in (lm_head=triton_greedy): the
            # plain LM head's configs, so that the logits are the same bits with the argmax and without, but for
            # llama-3.1-8b's, whose own config is faster in the step
            (1, 151936, 2048, True, True): ({'BLOCK_N': 8, 'BLOCK_K': 2048, 'SPLIT_K': 1}, 4, 1),
            (1, 128256, 2048, True, True): ({'BLOCK_N': 8, 'BLOCK_K': 1024, 'SPLIT_K': 1}, 4, 2),
            (1, 128256, 4096, True, True): ({'BLOCK_N': 16, 'BLOCK_K': 256, 'SPLIT_K': 1}, 4, 4),
        },
        "fused_gemv_rope_kernel": {
            (1, 5120, 2048, True, True, False): ({'BLOCK_N': 8, 'BLOCK_K': 1024, 'SPLIT_K': 1}, 4, 2),
            (1, 3072, 2048, False, True, False): ({'BLOCK_N': 8, 'BLOCK_K': 1024, 'SPLIT_K': 1}, 4, 2),
            (1, 6144, 4096, False, True, False): ({'BLOCK_N': 8, 'BLOCK_K': 512, 'SPLIT_K': 1}, 4, 3),
        },
        "fused_gemv_router_kernel": {  # qwen3's O projection with the router's sums: a whole row a tile, loaded
            # before the PDL wait
            (1, 2048, 4096, 128, True, True): ({'BLOCK_N': 8, 'BLOCK_K': 4096, 'SPLIT_K': 1}, 8, 1),
        },
        "expert_gemv_kernel": {
            (768, 768, 2048, True, True, False, False, 8, False, False, True): ({'BLOCK_N': 32, 'BLOCK_K': 256, 'PREFETCH': 1}, 4, 3),
            (2048, 0, 768, False, False, True, True, 8, True, False, True): ({'BLOCK_N': 16, 'BLOCK_K': 256, 'PREFETCH': 0}, 4, 3),
            (768, 768, 2048, True, True, False, False, 8, False, True, True): ({'BLOCK_N': 16, 'BLOCK_K': 256, 'PREFETCH': 0}, 4, 3),
            (2048, 0, 768, False, False, True, True, 8, True, True, True): ({'BLOCK_N': 32, 'BLOCK_K': 256, 'PREFETCH': 0}, 4, 3),
        },
    },
}


def autotuners() -> dict[str, Any]:
    """Kernel name -> its autotuner, for every kernel the table may pin (the fused, router and expert GEMVs)."""
    from athanor.kernels.jit import expert_gemv, fused_gemv, router_gemv

    tuned = (fused_gemv.fused_gemv_tuned, fused_gemv.fused_gemv_rope_tuned, fused_gemv.fused_gemv_argmax_tuned,
             router_gemv.fused_gemv_route_tuned, router_gemv.fused_gemv_router_tuned, expert_gemv.expert_gemv_tuned)
    return {t.fn.__name__: t for t in tuned}


LAUNCHED: dict[tuple[str, tuple[Any, ...]], Any] = {}
"""Every (kernel name, key) `launch_pinned` was asked for on the GPU in bf16, pinned or not, with the kernel's autotuner
(whose `configs` are the choices): the shapes to tune in the whole step."""


@functools.cache
def gpu_name(index: int) -> str:
    return torch.cuda.get_device_name(index)


def launch_pinned(kernel: Any, tuned: Any, grid: Callable[[dict[str, int]], tuple[int, ...]], args: tuple[Any, ...],
                  flags: dict[str, Any]) -> bool:
    """Launch `kernel` with the config pinned for this GPU and shape, if there is one (then True); else launch
    nothing and return False (the caller autotunes). `tuned` is the kernel's autotuner: its key names the shape."""
    x = args[0]
    if x.device.type != "cuda" or x.dtype != torch.bfloat16:
        return False
    name = kernel.fn.__name__  # the Python function's name
    values = {**dict(zip(tuned.arg_names, args, strict=False)), **flags}
    key = tuple(values[arg] for arg in tuned.keys)
    LAUNCHED[name, key] = tuned
    pin = PINNED.get(gpu_name(x.device.index or 0), {}).get(name, {}).get(key)
    if pin is None:
        return False
    meta, num_warps, num_stages = pin
    kernel[grid(meta)](*args, **flags, **meta, num_warps=num_warps, num_stages=num_stages)
    return True
