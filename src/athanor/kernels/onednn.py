"""Linear layers on a CPU through oneDNN, with each weight reordered once into oneDNN's blocked layout.

`F.linear` on a CPU calls MKL's sgemm on the row-major weight every time. oneDNN's inner product on a
weight packed once for it (the path Inductor's CPU weight prepacking takes) is faster at every SmolLM2
shape, decode and prefill rows alike, most on the wide LM head.
The results differ from `F.linear`'s by rounding only (a different summation order: ~5e-6 at fp32).
"""

from __future__ import annotations

import functools

import torch
from torch import Tensor


@functools.cache
def has_onednn(dtype: torch.dtype = torch.float32) -> bool:
    """Whether this torch build has oneDNN (mkldnn) with the prepacked linear ops for `dtype` on this CPU.
    Its bf16 and fp16 paths need AVX-512 (or AVX-NE-CONVERT): on an AVX2-only CPU (one development VM's AMD
    EPYC) packing a bf16 weight raises, so there only fp32 weights are packed."""
    if not (torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")):
        return False
    if dtype == torch.float32:
        return True
    if dtype == torch.bfloat16:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    return dtype == torch.float16 and bool(torch.ops.mkldnn._is_mkldnn_fp16_supported())


def pack_weight(w: Tensor) -> Tensor:
    """w [N, K] (CPU) reordered for `onednn_linear`: an opaque oneDNN tensor, a copy of the weight."""
    return torch.ops.mkldnn._reorder_linear_weight(w.contiguous())


def onednn_linear(x: Tensor, packed: Tensor, bias: Tensor | None = None) -> Tensor:
    """x [M, K] @ w.T (+ bias) for the weight `pack_weight` packed. Returns [M, N] in x's dtype."""
    return torch.ops.mkldnn._linear_pointwise(x.contiguous(), packed, bias, "none", [], "")
