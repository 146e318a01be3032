"""The CPU tier runs Triton's kernels in its interpreter: TRITON_INTERPRET is set here, before any test module
imports Triton (torch's attention modules do, and Triton makes its own @triton.jit helpers such as `tl.cdiv`
interpretable only if the variable is set by then). So the kernel tests run on a machine without a GPU, in fp32 and
tiny shapes; without Triton installed it changes nothing, and the Triton cases skip."""

import inspect
import os

os.environ.setdefault("TRITON_INTERPRET", "1")


def _patch_each_language_once_per_launch() -> None:
    """Triton's interpreter re-patches `triton.language` on every call of a @triton.jit function from inside a kernel
    (`InterpretedFunction.__call__`), scanning the language's modules each time: a third of the kernel tests' time.
    A launch's patch is already in place for such a call, so the call skips it when every language module its
    function sees is patched. A nested call's own patch is never undone (the interpreter drops its scope), so the
    modules it patched stay patched; the launch's are undone when the launch ends. An interpreter without these
    internals is left as it is."""
    try:
        from triton.runtime import interpreter
    except ImportError:
        return
    patch_lang = getattr(interpreter, "_patch_lang", None)
    tl = getattr(interpreter, "tl", None)
    if patch_lang is None or tl is None or not hasattr(interpreter, "_LangPatchScope"):
        return
    patched: set[int] = set()  # ids of the language modules whose patch is in place
    seen: dict[object, frozenset[int]] = {}

    class Scope:
        def __init__(self, scope: object, langs: frozenset[int]) -> None:
            self.scope, self.langs = scope, langs

        def restore(self) -> None:
            self.scope.restore()  # type: ignore[attr-defined]
            patched.difference_update(self.langs)

    def patch_once(fn):  # type: ignore[no-untyped-def]
        langs = seen.get(fn)
        if langs is None:
            langs = seen[fn] = frozenset(id(v) for v in fn.__globals__.values()
                                         if inspect.ismodule(v) and (v is tl or v is tl.core))
        if langs and langs <= patched:
            return Scope(interpreter._LangPatchScope(), frozenset())
        scope = patch_lang(fn)
        patched.update(langs)
        return Scope(scope, langs)

    interpreter._patch_lang = patch_once


if os.environ["TRITON_INTERPRET"] == "1":
    _patch_each_language_once_per_launch()
