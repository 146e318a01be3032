"""A fix for Triton's CPU interpreter under NumPy >= 2.3, applied only when `TRITON_INTERPRET=1`.

The interpreter keeps every scalar as a one-element array and converts it with `int(array)`
when a scalar bounds a `range(...)` loop; newer NumPy refuses to convert arrays of ndim > 0.
Compiled kernels are unaffected. The patch wraps the interpreter's tensor patching so that
`__index__` reads the single element instead.
"""

from __future__ import annotations

from typing import Any

_patched = False


def patch_interpreter() -> None:
    """Make Triton's interpreter accept runtime loop bounds (idempotent; a no-op without Triton)."""
    global _patched
    if _patched:
        return
    _patched = True
    try:
        from triton.runtime import interpreter
    except ImportError:
        return
    original = getattr(interpreter, "_patch_lang_tensor", None)
    if original is None:  # a Triton version without this hook: nothing to fix, or nothing we can fix
        return

    def patched(tensor: Any, scope: Any) -> None:
        original(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))

    interpreter._patch_lang_tensor = patched
