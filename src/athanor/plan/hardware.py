"""Hardware descriptions for the layout cost model: per-GPU memory, bandwidth, matrix rate and interconnect.

Figures are what a program reaches, not datasheet peaks: the copy bandwidth counts bytes read plus written (as
`athanor bench decode` measures it), the matrix rate is a large bf16 GEMM on random data, and the interconnect is an
all-reduce's bus bandwidth. The built-in ones were measured on this project's lent machines (device tool's KINDS.md);
`load_hardware(PATH)` reads another from a JSON file with the same fields.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path

from athanor.errors import ConfigError


@dataclass(frozen=True)
class Hardware:
    name: str
    memory_gib: float
    """Device memory per GPU."""
    hbm_bytes_s: float
    """Copy bandwidth per GPU: bytes read plus written per second."""
    matmul_flops: float
    """Dense bf16 matrix rate per GPU reached by a large GEMM (FLOP/s)."""
    link_bytes_s: float
    """Interconnect: an all-reduce's bus bandwidth between the GPUs of one machine (bytes/s)."""
    link_latency_s: float = 3e-6
    """Per other rank of a collective: what a small message costs however few its bytes (a one-shot all-reduce of
    a decode step's activations over NVLink takes some 5-20 us from 2 to 8 GPUs)."""
    step_overhead_s: float = 20e-6
    """Per decode step of a captured graph: launch and synchronisation the bytes and FLOPs do not account for."""
    prefill_efficiency: float = 0.7
    """Share of `matmul_flops` a prefill reaches (GEMMs at the model's shapes, attention, norms)."""
    memory_reserve: float = 0.1
    """Share of memory no layout may plan on (activations, allocator slack; a server's reserve)."""

    def usable_bytes(self) -> float:
        return self.memory_gib * 2**30 * (1.0 - self.memory_reserve)


KNOWN: dict[str, Hardware] = {
    # Copy bandwidth and GEMM rate as measured on the lent machines; NVLink all-reduce bus bandwidth ~330-360 GB/s.
    "h200": Hardware("NVIDIA H200", 139.0, 4.25e12, 790e12, 340e9),
    "h100": Hardware("NVIDIA H100 80GB HBM3", 78.0, 3.0e12, 790e12, 340e9),
    "a100": Hardware("NVIDIA A100 80GB", 79.0, 1.7e12, 280e12, 230e9, prefill_efficiency=0.65),
}


def load_hardware(name_or_path: str) -> Hardware:
    """A known GPU by name (h200, h100, a100) or a description in a JSON file (the `Hardware` fields)."""
    key = name_or_path.lower()
    if key in KNOWN:
        return KNOWN[key]
    path = Path(name_or_path)
    if not path.is_file():
        raise ConfigError(f"--gpu {name_or_path}: neither a known GPU ({', '.join(KNOWN)}) nor a JSON file")
    try:
        raw = json.loads(path.read_text())
        names = {f.name for f in dataclasses.fields(Hardware)}
        unknown = set(raw) - names
        if unknown:
            raise ConfigError(f"--gpu {path}: unknown field(s) {', '.join(sorted(unknown))}; the fields are "
                              f"{', '.join(sorted(names))}")
        return Hardware(**raw)
    except json.JSONDecodeError as e:
        raise ConfigError(f"--gpu {path}: not valid JSON ({e.msg} at line {e.lineno})") from None
    except TypeError as e:
        raise ConfigError(f"--gpu {path}: {e}; the fields are those of athanor.plan.hardware.Hardware") from None
