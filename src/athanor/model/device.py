"""`--device` and `--dtype` flags to torch objects, with one-line errors naming the flag."""

from __future__ import annotations

import torch

from athanor.errors import ConfigError

DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
          "float16": torch.float16, "fp16": torch.float16}


def resolve_device(name: str | None) -> torch.device:
    """`cpu`, `cuda`, `cuda:N`, or None for CUDA when present, else CPU."""
    if name is None or name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise ConfigError(f"--device {name}: not a device; use cpu or cuda[:N]") from None
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError(f"--device {name}: no CUDA device is visible on this machine; use --device cpu")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise ConfigError(f"--device {name}: only {torch.cuda.device_count()} CUDA device(s) here")
    elif device.type != "cpu":
        raise ConfigError(f"--device {name}: athanor runs on cpu or cuda")
    return device


def resolve_dtype(name: str | None, device: torch.device) -> torch.dtype:
    """The flag's dtype, or the default: fp32 on CPU, bf16 on CUDA."""
    if name is None:
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    try:
        return DTYPES[name]
    except KeyError:
        raise ConfigError(f"--dtype {name}: use one of float32, bfloat16, float16") from None
