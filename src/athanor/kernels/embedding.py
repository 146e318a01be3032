"""The token embedding of a decode step, as a kernel that lets the first projection launch under it."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from athanor.kernels.dispatch import Impl, cdiv, next_pow2, pdl, use_triton


def embedding(tokens: Tensor, table: Tensor, impl: Impl = None) -> Tensor:
    """table[tokens]: tokens [B] int64, table [V, H] -> [B, H] (what F.embedding returns, bit for bit: a copy).

    In Triton under programmatic dependent launch the gather triggers the next kernel's launch as it starts, so
    the first layer's QKV GEMV loads its first weight tiles while the rows are gathered (F.embedding's kernel
    cannot trigger it: the GEMV would launch only as it ends)."""
    if not use_triton(tokens, impl):
        return F.embedding(tokens, table)
    from athanor.kernels.jit.embedding import embedding_kernel

    assert tokens.dim() == 1 and table.stride(1) == 1
    rows, hidden = tokens.shape[0], table.shape[1]
    out = torch.empty((rows, hidden), dtype=table.dtype, device=table.device)
    if rows:
        block = min(next_pow2(hidden), 2048)
        embedding_kernel[(rows, cdiv(hidden, block))](tokens, table, out, hidden, table.stride(0), out.stride(0),
                                                      BLOCK=block, **pdl(tokens))
    return out
