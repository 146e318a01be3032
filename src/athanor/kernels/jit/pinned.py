"""Configs of the fused-GEMV kernels measured in the whole decode step, per GPU, for the preset models' batch-1 shapes.

Triton's autotuner times each config of a kernel alone, a few microseconds a launch, and its picks move from one
process to the next: the same code read llama-3.2-1b 0.888 ms, llama-3.1-8b 4.163 ms and qwen3-30b-a3b 2.740 ms with
one set of picks (850fc0c, the table below) and 0.931 / 4.206 / 3.107 ms with another (8d6e6cb, a fresh machine):
the 1B's QKV + RoPE kernel 107 against 133 us a step, qwen3's expert gate/up 790 against 985 us
(`bench/results/pinned-configs/`). Alone, a kernel neither waits on the one before nor shares the SMs with the next
one's resident programs, as it does under PDL in the step. So a shape listed here for the GPU at hand, in bf16,
launches with its config, as vLLM ships tuned MoE configs per GPU; every other shape, dtype or GPU is autotuned as
before. `ATHANOR_PINNED_CONFIGS=0` turns the table off (for A/B runs, or to tune afresh).

Keys are the autotuner's own (`tuned.keys`: M, N, K, then the kernel's flags, PDL and EARLY last); values
(meta-parameters, num_warps, num_stages).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch

from athanor.kernels import dispatch

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
            # The LM heads with the final norm inside (lm_head=triton_fused): the autotuner's picks in the runs measured
            # (`bench/results/lm-head-ab31ad2/`, `bench/results/step-copies-ccf91f1/`); qwen3-30b-a3b's 138 us (~4.5 TB/s),
            # none of its configs faster in the step (`bench/results/route-signal-71ce0f5/`)
            (1, 151936, 2048, True, False, False, True, True): ({'BLOCK_N': 8, 'BLOCK_K': 2048, 'SPLIT_K': 1}, 4, 1),
            (1, 128256, 2048, True, False, False, True, True): ({'BLOCK_N': 8, 'BLOCK_K': 1024, 'SPLIT_K': 1}, 4, 2),
            (1, 128256, 4096, True, False, False, True, True): ({'BLOCK_N': 4, 'BLOCK_K': 4096, 'SPLIT_K': 1}, 4, 1),
        },
        "fused_gemv_argmax_kernel": {  # the same LM heads with the greedy argmax folded in (lm_head=triton_greedy): the
            # plain LM head's configs, so that the logits are the same bits with the argmax and without, but
            # llama-3.1-8b's, tuned in the step (4.168, 4.170 against 4.222, 4.222 ms at its 4 x 4096;
            # qwen3-30b-a3b's 8 x 1024 read 2.4005, 2.4013 against 2.4017, 2.4018 at 8 x 2048, within the noise:
            # `bench/results/greedy-tune-ce08ef4/`)
            (1, 151936, 2048, True, True): ({'BLOCK_N': 8, 'BLOCK_K': 2048, 'SPLIT_K': 1}, 4, 1),
            (1, 128256, 2048, True, True): ({'BLOCK_N': 8, 'BLOCK_K': 1024, 'SPLIT_K': 1}, 4, 2),
            (1, 128256, 4096, True, True): ({'BLOCK_N': 16, 'BLOCK_K': 256, 'SPLIT_K': 1}, 4, 4),
        },
        "fused_gemv_rope_kernel": {
            (1, 5120, 2048, True, True, False): ({'BLOCK_N': 8, 'BLOCK_K': 1024, 'SPLIT_K': 1}, 4, 2),
            (1, 3072, 2048, False, True, False): ({'BLOCK_N': 8, 'BLOCK_K': 1024, 'SPLIT_K': 1}, 4, 2),
            (1, 6144, 4096, False, True, False): ({'BLOCK_N': 8, 'BLOCK_K': 512, 'SPLIT_K': 1}, 4, 3),
        },
        "fused_gemv_router_kernel": {  # qwen3's O projection with the router's sums: a whole row a
            # tile, loaded before the PDL wait (the step 2.448 ms; 2.465 at 8 x 2048, 2.526 at 8 x 512 split 4: bench/README)
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
(whose `configs` are the choices): what `bench/step_tune.py` tunes in the whole step."""


@functools.cache
def gpu_name(index: int) -> str:
    return torch.cuda.get_device_name(index)


def launch_pinned(kernel: Any, tuned: Any, grid: Callable[[dict[str, int]], tuple[int, ...]], args: tuple[Any, ...],
                  flags: dict[str, Any]) -> bool:
    """Launch `kernel` with the config pinned for this GPU and shape, if there is one (then True); else launch
    nothing and return False (the caller autotunes). `tuned` is the kernel's autotuner: its key names the shape."""
    x = args[0]
    if not dispatch.PINNED_CONFIGS or x.device.type != "cuda" or x.dtype != torch.bfloat16:
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
