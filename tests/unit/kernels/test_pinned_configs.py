"""The table of kernel configs measured in the decode step (`athanor.kernels.jit.pinned`)."""

from __future__ import annotations

import pytest

pytest.importorskip("triton", reason="Triton is not installed")

from athanor.kernels.jit import fused_gemv
from athanor.kernels.jit.pinned import PINNED


@pytest.mark.parametrize("gpu", sorted(PINNED))
def test_every_pin_is_one_of_the_autotuned_configs_under_the_autotuners_key(gpu: str) -> None:
    """A pin only chooses among the configs the autotuner would time (no config the tests have not compiled), and its
    key reads as that autotuner's: one value per key name, so a launch finds it."""
    for kernel_name, pins in PINNED[gpu].items():
        tuned = getattr(fused_gemv, kernel_name.replace("_kernel", "_tuned"))
        assert tuned.fn.__name__ == kernel_name
        offered = {(tuple(sorted(c.kwargs.items())), c.num_warps, c.num_stages) for c in tuned.configs}
        for key, (meta, num_warps, num_stages) in pins.items():
            assert len(key) == len(tuned.keys), (kernel_name, key)
            assert (tuple(sorted(meta.items())), num_warps, num_stages) in offered, (kernel_name, key)
