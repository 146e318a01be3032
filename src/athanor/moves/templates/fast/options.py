"""The switches: the OPTIONS dict `athanor.moves.render` fills in, and how a kernel call reads its option."""

from __future__ import annotations

from typing import Any, Literal

from athanor.moves.catalog import baseline_options

# --- OPTIONS (rendered by athanor.moves.render) ---
OPTIONS: dict[str, Any] = baseline_options()
# --- end OPTIONS ---


def impl(option: str) -> Literal["torch"] | None:
    """The `impl` argument for a kernel: "torch" forces the fallback; "triton..." values pass None,
    which runs Triton wherever it can (CUDA, or TRITON_INTERPRET=1) and PyTorch elsewhere."""
    return None if str(OPTIONS[option]).startswith("triton") else "torch"
