"""Compile the expert GEMV for sm_90 and count its global loads by width, with ptxas' register count (issue 7).

No GPU needed: Triton compiles for a target it is given (the registers need the ptxas Triton bundles). Whether a
weight tile is read 16 bytes a load (ld.global.v4.b32) or 2 (ld.global.b16) decides the registers a program needs,
and so how many programs an SM holds. The pointer arguments are declared 16-byte aligned and the integer ones
multiples of 16, as Triton's launcher specialises them for qwen3-30b-a3b's shapes.

    python bench/ptx_loads.py            # gate/up (32 x 256, PREFETCH 1) and down (32 x 256) at the pinned configs
"""

from __future__ import annotations

import collections
import glob
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

POINTERS = {"IDS": "*i64", "TOPW": "*fp32", "WS": "*fp32", "TICKETS": "*i32", "RB": "*fp32", "X": "*bf16",
            "X2": "*bf16", "W": "*bf16", "W2": "*bf16", "NW": "*bf16", "R": "*bf16", "Y": "*bf16"}
UNALIGNED = ("ids_s0", "E", "N2")  # 8, 128 and 0 at these shapes: not declared multiples of 16


def compile_ptx(which: str, block_n: int, block_k: int, prefetch: int) -> str:
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    try:
        from athanor.kernels.jit.expert_gemv import expert_gemv_kernel as kernel
    except ImportError:  # a tree from before the kernel had its own module
        from athanor.kernels.jit.fused_gemv import expert_gemv_kernel as kernel

    gate_up = which == "gate_up"
    flags = {"SHARED": gate_up, "NORM": gate_up, "SILU": not gate_up, "SUM": not gate_up, "RESIDUAL": not gate_up,
             "TOP_K": 8, "SETTLED": not gate_up, "ROUTE": False, "SOFTMAX": False, "RENORM": False,
             "HAS_BIAS": False, "BLOCK_E": 1, "CHUNK": 1, "BLOCK_N": block_n, "BLOCK_K": block_k, "PDL": True,
             "RSTD_BLOCK": 2048 if gate_up else 1024}
    if "PREFETCH" in kernel.arg_names:
        flags["PREFETCH"] = prefetch
    if "EVICT" in kernel.arg_names:
        flags["EVICT"] = ""
    signature = {name: "constexpr" if name in flags else POINTERS.get(name, "fp32" if name == "eps" else "i32")
                 for name in kernel.arg_names}
    attrs = {(i,): [["tt.divisibility", 16]] for i, (name, kind) in enumerate(signature.items())
             if kind not in ("constexpr", "fp32") and name not in UNALIGNED}
    source = ASTSource(fn=kernel, signature=signature, attrs=attrs,
                       constexprs={(kernel.arg_names.index(k),): v for k, v in flags.items()})
    compiled = triton.compile(source, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4, "num_stages": 3})
    return compiled.asm["ptx"]


def registers(ptx: str) -> str:
    """ptxas' count for the PTX (its .version lowered to what the bundled ptxas reads)."""
    import triton

    ptxas = glob.glob(os.path.join(os.path.dirname(triton.__file__), "backends/nvidia/bin/ptxas"))
    if not ptxas:
        return "?"
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "k.ptx"
        path.write_text(re.sub(r"\.version \d+\.\d+", ".version 8.7", ptx))
        out = subprocess.run([ptxas[0], "-arch=sm_90a", "-v", str(path), "-o", str(Path(tmp) / "k.o")],
                             capture_output=True, text=True).stderr
    found = re.search(r"Used (\d+) registers", out)
    return found.group(1) if found else "?"


def main() -> int:
    import triton

    print(f"Triton {triton.__version__}")
    for which, block_n, block_k, prefetch in (("gate_up", 32, 256, 1), ("gate_up", 16, 256, 0), ("down", 32, 256, 0)):
        ptx = compile_ptx(which, block_n, block_k, prefetch)
        loads = collections.Counter(re.findall(r"ld\.global[a-z0-9.:_]*", ptx))
        print(f"{which} {block_n} x {block_k} prefetch {prefetch}: {registers(ptx)} registers, loads {dict(loads)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
