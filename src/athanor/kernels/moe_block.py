"""A decode step's MoE block from the attention's output on: the O projection, the router, routing and the routed
experts, in one persistent Triton launch (`jit.moe_block`) instead of four, or the four where it does not apply.

A move for the search (`routing=triton_moe_block`), not the best-known: on an H200 it is slower than the four
launches, since its few programs an SM keep too few weight bytes in flight and its grid-wide waits cost what the
kernel boundaries did."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import torch
from torch import Tensor

from athanor.errors import ConfigError
from athanor.kernels.attention import _num_sms
from athanor.kernels.dispatch import (
    Impl,
    _zeroed,
    cdiv,
    interpreting,
    next_pow2,
    pdl,
    router_sums,
    rstd_block,
    tickets,
    use_triton,
)
from athanor.kernels.gemv import MAX_FUSED_ROWS, ROUTER_SCALE, _workspace, linear_route
from athanor.kernels.moe import routed_experts


@dataclass(frozen=True)
class MoeBlockConfig:
    """How the persistent kernel runs on the GPU (no value changes): the blocks of its three GEMVs (1: O, split-K;
    2: the experts' gate/up; 3: their down) and its grid, `per_sm` programs an SM, fewer where the compiled kernel's
    registers or shared memory do not let that many be resident at once (the grid barrier needs them all).
    `rank_chunk`: `rank_logits`'s CHUNK (0: every rank at once in registers). A bad field is a one-line error."""

    block_n1: int = 8
    block_k1: int = 1024
    split_k1: int = 1
    block_n2: int = 16
    block_k2: int = 512
    block_n3: int = 8
    block_k3: int = 1024
    rank_chunk: int = 32
    num_warps: int = 4
    num_stages: int = 3
    per_sm: int = 4

    def __post_init__(self) -> None:
        for name, value in asdict(self).items():
            block = name.startswith("block_") or name == "rank_chunk"  # Triton's blocks: powers of two
            least = 0 if name == "rank_chunk" else 1
            if not isinstance(value, int) or value < least or (block and value & (value - 1)):
                what = ("0 or a power of two" if least == 0 else "a power of two") if block else "a positive integer"
                raise ConfigError(f"MoeBlockConfig.{name} must be {what}, not {value!r}")


@dataclass(frozen=True)
class MoeBlockOutput:
    """What `moe_block` computes: the residual stream after the block (out), and on the way h (after the O
    projection), the router's logits [M, E], the ids [M, k] int64 and weights [M, k] fp32 of the chosen experts."""

    out: Tensor
    h: Tensor
    logits: Tensor
    ids: Tensor
    weights: Tensor


MAX_PROGRAMS_PER_SM = 32
"""The most programs an SM holds at once (Hopper): the grid is at most this many an SM."""

SPINS = 1 << 22
"""Reads of the barrier's count before a program gives up waiting (~a second): a grid that cannot be resident at once
fails a test instead of hanging the GPU."""


def moe_block(x: Tensor, wo: Tensor, residual: Tensor, router_w: Tensor, norm_weight: Tensor, eps: float, top_k: int,
              scoring: str, renormalize: bool, selection_bias: Tensor | None, w_gate: Tensor, w_up: Tensor,
              w_down: Tensor, impl: Impl = None, stamps: Tensor | None = None, *,
              config: MoeBlockConfig | None = None) -> MoeBlockOutput:
    """The O projection and the MoE block after it, for <= 8 decode rows:

        h = residual + x @ wo.T; logits, ids, weights = linear_route(...)   (see `linear_route`)
        out = h + sum_j weights[:, j] * silu(hn @ w_gate[ids_j].T) * (hn @ w_up[ids_j].T) @ w_down[ids_j].T
                                                  (hn = rms_norm(h, norm_weight); as `expert_gemv`'s two calls)

    w_gate, w_up: [E, NI, H]; w_down: [E, H, NI]. In Triton one launch does it all (`jit.moe_block`), bit for bit
    what `linear_route` and the two `expert_gemv` calls give for the same blocks; elsewhere (PyTorch, more rows,
    another scoring) those are called. `stamps` (int64, [programs, 8] at least, on the GPU): each program's clock at
    the phases' ends (`jit.moe_block`'s TIMING), to time the phases apart. `config`: the GPU launch's blocks and grid
    (None: `MoeBlockConfig()`)."""
    m, k = x.shape
    e, hidden = router_w.shape
    ni = w_gate.shape[1]
    fused = (m <= MAX_FUSED_ROWS and use_triton(x, impl) and scoring in ("softmax", "sigmoid")
             and m * e <= router_sums(x.device).numel() and x.stride(1) == 1 and wo.stride(1) == 1
             and residual.stride(1) == 1 and router_w.is_contiguous()
             and all(w.stride(2) == 1 for w in (w_gate, w_up, w_down)) and w_gate.stride() == w_up.stride())
    if not fused or m == 0:
        h, logits, ids, weights = linear_route(x, wo, residual, router_w, norm_weight, eps, top_k, scoring,
                                               renormalize, selection_bias, impl=impl)
        out = routed_experts(h, w_gate, w_up, w_down, ids, weights, norm_weight, eps, impl=impl)
        return MoeBlockOutput(out, h, logits, ids, weights)
    from athanor.kernels.jit.moe_block import moe_block_kernel

    dev = x.device
    h = torch.empty((m, hidden), dtype=x.dtype, device=dev)
    out = torch.empty_like(h)
    logits = torch.empty((m, e), dtype=x.dtype, device=dev)
    ids = torch.empty((m, top_k), dtype=torch.long, device=dev)
    weights = torch.empty((m, top_k), dtype=torch.float32, device=dev)
    gate_up = torch.empty((m * top_k, 2 * ni), dtype=x.dtype, device=dev)
    args = (x, wo, residual, h, _workspace(m, hidden, dev), tickets(dev), router_w, norm_weight, router_sums(dev),
            logits, selection_bias if selection_bias is not None else logits, ids, weights, w_gate, w_up, gate_up,
            w_down, out, _zeroed("moe_block_barrier", dev, 4, torch.int32), stamps if stamps is not None else ids,
            torch.empty(next_pow2(e), dtype=torch.float32, device=dev),  # the routing program's ranks' scratch
            torch.empty(m, dtype=torch.float32, device=dev),  # each row's 1/RMS, from the routing program
            m, hidden, k, e, ni, eps, ROUTER_SCALE, 1.0 / ROUTER_SCALE,
            x.stride(0), wo.stride(0), residual.stride(0), h.stride(0), w_gate.stride(0), w_gate.stride(1),
            w_up.stride(0), w_up.stride(1), gate_up.stride(0), w_down.stride(0), w_down.stride(1), out.stride(0))
    flags: dict[str, Any] = {"TOP_K": top_k, "SOFTMAX": scoring == "softmax", "RENORM": renormalize,
                             "HAS_BIAS": selection_bias is not None, "BLOCK_E": next_pow2(e), "BLOCK_M": next_pow2(m),
                             "BLOCK_P": next_pow2(next_pow2(m) * top_k),
                             "RSTD_BLOCK": rstd_block(hidden) or min(1024, next_pow2(hidden)),
                             "SPINS": SPINS, "TIMING": stamps is not None, **pdl(x)}
    if interpreting():  # the blocks of linear_route's and expert_gemv's interpreter launches: the same bits
        split = 3 if k >= 192 else 1
        meta = {"BLOCK_N1": 16, "BLOCK_K1": 64, "SPLIT_K1": split, "BLOCK_N2": 16, "BLOCK_K2": 32, "BLOCK_N3": 16,
                "BLOCK_K3": 32, "RANK_CHUNK": 8}
        for phase in (1, 2, 3):  # the interpreter runs programs one after another: no barrier can wait
            moe_block_kernel[(3,)](*args, **flags, **meta, PHASE=phase)
        return MoeBlockOutput(out, h, logits, ids, weights)
    config = config or MoeBlockConfig()
    meta = {name.upper(): value for name, value in asdict(config).items()
            if name.startswith("block_") or name in ("split_k1", "rank_chunk")}
    launch = {**meta, "num_warps": config.num_warps, "num_stages": config.num_stages}
    programs = _num_sms(dev) * resident_per_sm(moe_block_kernel, args, {**flags, **launch, "PHASE": 0}, config.per_sm)
    moe_block_kernel[(programs,)](*args, **flags, **launch, PHASE=0)
    return MoeBlockOutput(out, h, logits, ids, weights)


_RESIDENT: dict[tuple[Any, ...], int] = {}


def resident_per_sm(kernel: Any, args: tuple[Any, ...], kwargs: dict[str, Any], wanted: int) -> int:
    """min(wanted, how many programs of the compiled kernel an SM holds at once by its registers, shared memory and
    threads): a grid barrier's programs must all be resident. Compiles the kernel (no launch) on first use."""
    key = (kernel.fn.__name__, wanted, *sorted((name, value) for name, value in kwargs.items()
                                             if isinstance(value, (bool, int, str))),
           *(a.dtype if isinstance(a, Tensor) else None for a in args))
    if key not in _RESIDENT:
        compiled = kernel.warmup(*args, grid=(1,), **kwargs)
        compiled._init_handles()  # sets n_regs (Triton reads it when the binary is loaded)
        props = torch.cuda.get_device_properties(args[0].device)
        warps = kwargs.get("num_warps", 4)
        regs_per_warp = cdiv(max(compiled.n_regs, 1) * 32, 256) * 256  # allocated per warp in units of 256
        fits = [getattr(props, "regs_per_multiprocessor", 65536) // (regs_per_warp * warps),
                getattr(props, "max_threads_per_multi_processor", 2048) // (32 * warps)]
        shared = compiled.metadata.shared
        if shared:
            fits.append(getattr(props, "shared_memory_per_multiprocessor", 233472) // (shared + 1024))
        _RESIDENT[key] = max(1, min(wanted, MAX_PROGRAMS_PER_SM, *fits))
    return _RESIDENT[key]
