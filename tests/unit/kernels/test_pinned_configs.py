"""The table of kernel configs measured in the decode step (`athanor.kernels.jit.pinned`)."""

from __future__ import annotations

import pytest

pytest.importorskip("triton", reason="Triton is not installed")

from athanor.kernels.jit import fused_gemv
from athanor.kernels.jit.pinned import PINNED, autotuners


@pytest.mark.parametrize("gpu", sorted(PINNED))
def test_every_pin_is_one_of_the_autotuned_configs_under_the_autotuners_key(gpu: str) -> None:
    """A pin only chooses among the configs the autotuner would time (no config the tests have not compiled), and its
    key reads as that autotuner's: one value per key name, so a launch finds it."""
    for kernel_name, pins in PINNED[gpu].items():
        tuned = autotuners()[kernel_name]
        offered = {(tuple(sorted(c.kwargs.items())), c.num_warps, c.num_stages) for c in tuned.configs}
        for key, (meta, num_warps, num_stages) in pins.items():
            assert len(key) == len(tuned.keys), (kernel_name, key)
            assert (tuple(sorted(meta.items())), num_warps, num_stages) in offered, (kernel_name, key)


class _Kernel:
    """Stands in for a JIT kernel: records the grid and the keyword arguments of its one launch."""

    def __init__(self) -> None:
        self.fn = fused_gemv.fused_gemv_kernel.fn  # the Python function, whose name the table is keyed by
        self.launches: list[tuple[tuple[int, ...], dict[str, object]]] = []

    def __getitem__(self, grid):  # kernel[grid](*args, **kwargs), as Triton's
        return lambda *args, **kwargs: self.launches.append((grid, kwargs))


def test_a_pinned_shape_launches_its_config_and_another_shape_is_left_to_the_autotuner(monkeypatch) -> None:
    """On the GPU the table is looked up by the autotuner's key read from the launch's arguments; a hit launches the
    kernel itself with the pinned meta-parameters, warps and stages on the grid they give; a miss or another dtype
    launches nothing (the caller autotunes)."""
    import torch

    from athanor.kernels.jit import pinned

    class Tensor:  # a bf16 tensor on a GPU, as far as the lookup reads one
        def __init__(self, dtype: torch.dtype = torch.bfloat16) -> None:
            self.device, self.dtype = torch.device("cuda", 0), dtype

    monkeypatch.setattr(pinned, "gpu_name", lambda index: "NVIDIA H200")
    tuned = fused_gemv.fused_gemv_tuned
    flags = {"NORM": True, "SILU": False, "RESIDUAL": False, "PDL": True, "EARLY": True, "BLOCK_M": 1}

    def args(n: int, dtype: torch.dtype = torch.bfloat16) -> tuple[object, ...]:
        values = {"M": 1, "N": n, "K": 2048}
        positional = tuned.arg_names[:tuned.arg_names.index("NORM")]  # the flags come as keywords
        return tuple(values.get(name, Tensor(dtype)) for name in positional)

    kernel = _Kernel()
    assert pinned.launch_pinned(kernel, tuned, lambda meta: (16384 // meta["BLOCK_N"], meta["SPLIT_K"]),
                                args(16384), flags)
    (grid, kwargs), = kernel.launches
    assert grid == (1024, 1) and kwargs["BLOCK_N"] == 16 and kwargs["BLOCK_K"] == 256
    assert (kwargs["num_warps"], kwargs["num_stages"], kwargs["NORM"]) == (4, 4, True)
    assert not pinned.launch_pinned(kernel, tuned, lambda meta: (1, 1), args(12288), flags)  # not measured
    assert not pinned.launch_pinned(kernel, tuned, lambda meta: (1, 1), args(16384, torch.float32), flags)
    assert len(kernel.launches) == 1
