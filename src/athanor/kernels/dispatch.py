"""When a kernel runs in Triton and when it falls back to PyTorch.

Triton is optional: without it every kernel runs its PyTorch fallback. With it, a kernel runs
in Triton when its tensors are on CUDA, or anywhere when `TRITON_INTERPRET=1` is set (Triton's
interpreter runs kernels on CPU tensors; the unit tests use it in fp32).
"""

from __future__ import annotations

import functools
import importlib.util
import os
from typing import Any, Literal

from torch import Tensor

from athanor.errors import ConfigError


def _has_triton() -> bool:
    try:
        return importlib.util.find_spec("triton") is not None
    except (ImportError, ValueError):  # ValueError: a blocked module (sys.modules["triton"] = None)
        return False


HAS_TRITON = _has_triton()
"""Whether Triton is installed (it is imported only when a kernel first runs)."""

Impl = Literal["triton", "torch"] | None
"""A forced implementation, or None to let `use_triton` decide."""


def interpreting() -> bool:
    """True when Triton's CPU interpreter is on (`TRITON_INTERPRET=1`)."""
    return os.environ.get("TRITON_INTERPRET", "") == "1"


def use_triton(t: Tensor, impl: Impl = None) -> bool:
    """Whether a kernel whose main input is `t` should run its Triton version."""
    if impl == "torch":
        return False
    if impl == "triton":
        if not HAS_TRITON:
            raise ConfigError("impl='triton' was asked for, but Triton is not installed (pip install triton)")
        if interpreting():
            from athanor.kernels.interpreter import patch_interpreter

            patch_interpreter()
        return True
    if impl is not None:
        raise ConfigError(f"impl must be 'triton', 'torch' or None, not {impl!r}")
    if not HAS_TRITON:
        return False
    if interpreting():
        from athanor.kernels.interpreter import patch_interpreter

        patch_interpreter()
        return True
    return t.is_cuda


def pdl(t: Tensor) -> dict[str, Any]:
    """Launch arguments for a kernel with a `PDL` flag that opens with `if PDL: gdc_wait()`.

    Programmatic dependent launch (Hopper and later): the kernel's programs may start while the
    kernel before it drains, do what needs none of its results (a GEMV issues its first weight
    loads), then wait at `gdc_wait` for it to finish. Every decode kernel pays a launch and a ramp
    of a microsecond or two, and a batch-1 step is a hundred or more kernels. Off on the CPU
    interpreter (no inline PTX there) and before Hopper.

    The fused GEMVs let the next kernel launch as they start (`EARLY`; those with a RoPE or routing epilogue after
    their weight stream), `expert_gemv` right after its wait (which `expert_gemv(settled=True)` relies on), the
    routing kernel at its start, the attention's split and merge kernels where asked (`decode_attention(split_early=,
    merge_early=)`), the RoPE kernel as it exits. Earlier is not always better: a consumer's programs resident
    through its producer's run slow it (the O projection's, while attention runs)."""
    on = t.is_cuda and not interpreting() and _pdl_capable(t.device.index)
    return {"PDL": True, "launch_pdl": True} if on else {"PDL": False}


def check_choice(name: str, value: int, allowed: tuple[int, ...], unit: str) -> int:
    """`value`, a kernel's keyword parameter `name`, if it is one of `allowed`; else a one-line ConfigError naming
    the parameter (checked before any launch, so a bad value launches nothing)."""
    if value not in allowed:
        listed = ", ".join(map(str, allowed[:-1])) + f" or {allowed[-1]}"
        raise ConfigError(f"{name} must be {listed} ({unit}), not {value!r}")
    return value


WARPS = (1, 2, 4)
"""The warps a small latency-bound kernel may launch with (the routing kernel on the router sums, the attention's
split and merge kernels): fewer warps reduce through shuffles alone, without shared-memory round trips and barriers
between warps. 8 is not offered: the routing kernel's ranks at 8 warps left a token's id slot unwritten on an H200."""


def rstd_block(k: int) -> int:
    """The RSTD_BLOCK of a fused GEMV whose normed rows are k long: the row in one load up to 4096 (128 on the CPU
    interpreter, so the tests take the loop too), not in chunks of the weight tile's BLOCK_K, a round trip to L2
    each, before the first tile is multiplied."""
    return min(128 if interpreting() else 4096, next_pow2(k))


@functools.cache
def _pdl_capable(index: int | None) -> bool:
    import torch

    return torch.cuda.get_device_capability(index)[0] >= 9


_ZEROED: dict[tuple[str, Any], Tensor] = {}


def _zeroed(name: str, device: Any, n: int, dtype: Any) -> Tensor:
    """One zero-filled array per name and device, kept: the kernels that use it leave it zero again."""
    if (name, device) not in _ZEROED:
        import torch

        _ZEROED[name, device] = torch.zeros(n, dtype=dtype, device=device)
    return _ZEROED[name, device]


ARGMAX_SLOTS = 32
"""Running maxima per row of the greedy LM head (`fused_gemv_argmax_kernel`): its programs spread their atomics over
them, each on its own 128-byte line."""


def argmax_best(device: Any) -> Tensor:
    """int64 running maxima of the greedy LM head's packed (logit, column) keys: ARGMAX_SLOTS per row of up to 8, 16
    words apart (`fused_gemv_argmax_kernel` folds into them; `argmax_tokens_kernel` reads and zeroes them)."""
    import torch

    return _zeroed("argmax_best", device, 8 * ARGMAX_SLOTS * 16, torch.int64)


def router_sums(device: Any) -> Tensor:
    """int64 accumulators of MoE router logits in fixed point (`fused_gemv_router_kernel` adds into them, the routing
    kernel after it reads and zeroes them), [rows, experts] row-major, each `linear_route(sums_spread=)` apart:
    1 << 17 of them (1 MB): 8 rows of 128 experts 128 apart, one row of 1024 experts 128 apart."""
    import torch

    return _zeroed("router_sums", device, 1 << 17, torch.int64)


def tickets(device: Any) -> Tensor:
    """Counters for the kernels whose programs reduce each other's partials (split-K GEMVs, expert sums,
    split-KV attention): the last program of a group to take a ticket does the reduction and resets the
    counter, so the array is zero between launches. One array per device: launches on one stream touch
    it in stream order (under PDL a kernel starts early but touches tickets only after its `gdc_wait`,
    i.e. after the previous kernel has finished), and no launch uses more than its 65536 counters."""
    import torch

    return _zeroed("tickets", device, 1 << 16, torch.int32)


def next_pow2(n: int) -> int:
    """The smallest power of two >= n (Triton block sizes must be powers of two)."""
    return 1 << max(0, (n - 1).bit_length())


def cdiv(a: int, b: int) -> int:
    """ceil(a / b) for positive ints."""
    return -(-a // b)
