"""Fixes for Triton's CPU interpreter, applied only when `TRITON_INTERPRET=1`.

1. NumPy >= 2.3: the interpreter keeps every scalar as a one-element array and converts it with
   `int(array)` when a scalar bounds a `range(...)` loop; newer NumPy refuses to convert arrays of
   ndim > 0. The patch gives the interpreter's tensors an `__index__` that reads the single element.
2. bf16: the interpreter stores bf16 as raw uint16 bits, so bf16 arithmetic (`x + r`) and a bf16
   `tl.dot` compute on the bit patterns (garbage or NaN), and fp32 -> bf16 casts truncate where
   the GPU rounds to nearest even. The patch does what the GPU does: bf16 operands are widened to
   fp32 (exact), arithmetic and dots run in fp32, and results are rounded to nearest even. This is
   what lets the unit tests run the kernels in bf16 on CPU.

Compiled kernels are unaffected.
"""

from __future__ import annotations

from typing import Any

import numpy as np

_patched = False


def bf16_bits_to_f32(bits: np.ndarray) -> np.ndarray:
    """bf16 values stored as uint16 bits -> float32 (exact)."""
    return (bits.astype(np.uint32) << 16).view(np.float32)


def f32_to_bf16_bits(x: np.ndarray) -> np.ndarray:
    """float32 -> bf16 bits (uint16), rounded to nearest even as the GPU does; NaN stays NaN."""
    bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    rounded = ((bits + np.uint32(0x7FFF) + ((bits >> 16) & np.uint32(1))) >> 16).astype(np.uint16)
    return np.where(np.isnan(x), np.uint16(0x7FC0), rounded).astype(np.uint16)


def patch_interpreter() -> None:
    """Make Triton's interpreter accept runtime loop bounds and compute bf16 like the GPU (idempotent;
    a no-op without Triton, or for a Triton whose interpreter lacks the hooks patched here)."""
    global _patched
    if _patched:
        return
    _patched = True
    try:
        import triton.language as tl
        from triton.runtime import interpreter
    except ImportError:
        return
    original = getattr(interpreter, "_patch_lang_tensor", None)
    if original is not None:

        def patched(tensor: Any, scope: Any) -> None:
            original(tensor, scope)
            scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))

        interpreter._patch_lang_tensor = patched
    _patch_bf16(interpreter, tl)


def _patch_bf16(interpreter: Any, tl: Any) -> None:
    builder, handle = getattr(interpreter, "InterpreterBuilder", None), getattr(interpreter, "TensorHandle", None)
    convert = getattr(interpreter, "_convert_float", None)
    if builder is None or handle is None or convert is None or not hasattr(builder, "binary_op"):
        return
    bf16, f32 = tl.bfloat16, tl.float32

    def convert_float(data: Any, src: Any, dst: Any, rounding_mode: Any) -> Any:
        if src == bf16 and dst == f32:
            return bf16_bits_to_f32(np.asarray(data).view(np.uint16)).view(np.uint32)
        if src == f32 and dst == bf16:
            return f32_to_bf16_bits(np.asarray(data).view(np.float32))
        return convert(data, src, dst, rounding_mode)

    interpreter._convert_float = convert_float
    binary_op, create_dot = builder.binary_op, builder.create_dot

    def bf16_binary_op(self: Any, lhs: Any, rhs: Any, op: Any) -> Any:
        if lhs.dtype.scalar != bf16 or rhs.dtype.scalar != bf16:
            return binary_op(self, lhs, rhs, op)
        out = op(bf16_bits_to_f32(lhs.data.view(np.uint16)), bf16_bits_to_f32(rhs.data.view(np.uint16)))
        if out.dtype == np.bool_:  # a comparison
            return handle(out, tl.int1)
        return handle(f32_to_bf16_bits(out.astype(np.float32)), bf16)

    def bf16_dot(self: Any, a: Any, b: Any, d: Any, input_precision: Any, max_num_imprecise_acc: Any) -> Any:
        if a.dtype.scalar == bf16 and b.dtype.scalar == bf16:
            a = handle(bf16_bits_to_f32(a.data.view(np.uint16)), f32)
            b = handle(bf16_bits_to_f32(b.data.view(np.uint16)), f32)
        return create_dot(self, a, b, d, input_precision, max_num_imprecise_acc)

    builder.binary_op = bf16_binary_op
    builder.create_dot = bf16_dot
