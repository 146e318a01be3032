"""Sampling on the device: greedy (a Triton argmax) and top-k / top-p with temperature.

Both are static-shape and sync-free, so they can sit inside a captured decode step. Top-k/top-p
draws with the engine's counter-based noise (`athanor.model.sampling.uniform_noise`), so with
top_k = vocab it picks exactly what `athanor.model.sampling.sample` picks; with a small top_k it
sorts k values instead of the whole vocabulary. The engine owns sampling (docs/architecture.md), so these are
engine and serving paths, not a candidate option: its argmax graph takes `greedy` on a GPU
(`athanor.engine.graphs`); top-k/top-p is not adopted yet.
"""

from __future__ import annotations

import torch
from torch import Tensor

from athanor.kernels.dispatch import Impl, cdiv, interpreting, next_pow2, pdl, tickets, use_triton
from athanor.model.sampling import uniform_noise


def greedy(logits: Tensor, impl: Impl = None) -> Tensor:
    """argmax over the vocabulary. logits: [B, V]. Returns [B] int64."""
    if not use_triton(logits, impl):
        return torch.argmax(logits, dim=-1)
    from athanor.kernels.jit.sampling import argmax_kernel

    if logits.stride(1) != 1:
        logits = logits.contiguous()
    rows, vocab = logits.shape
    out = torch.empty(rows, dtype=torch.long, device=logits.device)
    if rows == 0:
        return out
    assert rows <= 1 << 16, "one ticket per row"
    block = 256 if interpreting() else 1024
    chunk = 2 * block  # larger chunks are no faster in the step
    parts = cdiv(vocab, chunk)
    values = torch.empty(rows * parts, dtype=torch.float32, device=logits.device)
    indices = torch.empty(rows * parts, dtype=torch.int32, device=logits.device)
    # Under programmatic dependent launch the argmax's programs wait resident for the LM head instead of launching
    # after it, as every decode kernel's do.
    argmax_kernel[(rows, parts)](logits, out, values, indices, tickets(logits.device), logits.stride(0), vocab,
                                 CHUNK=chunk, BLOCK=block, PARTS_P2=next_pow2(parts), **pdl(logits))
    return out


def sample_top_k_top_p(logits: Tensor, temperature: Tensor, top_p: Tensor, seeds: Tensor, positions: Tensor,
                       top_k: int) -> Tensor:
    """Next tokens [B] int64: greedy where temperature <= 0, else temperature, top-k, then top-p.

    logits: [B, V]; temperature, top_p: [B] fp32; seeds, positions: [B] int64; top_k: static (1..V).
    """
    logits = logits.float()
    vocab = logits.shape[-1]
    temp = torch.clamp(temperature, min=1e-5)[:, None]
    top_vals, top_ids = torch.topk(logits / temp, min(top_k, vocab), dim=-1)  # sorted, descending
    probs = torch.softmax(top_vals, dim=-1)  # renormalised over the top k
    before = torch.cumsum(probs, dim=-1) - probs
    probs = torch.where(before < top_p[:, None], probs, torch.zeros_like(probs))
    noise = uniform_noise(seeds, positions, vocab).gather(1, top_ids)
    choice = torch.gather(top_ids, 1, torch.argmax(probs / (-torch.log(noise)), dim=-1, keepdim=True))[:, 0]
    return torch.where(temperature > 0, choice, greedy(logits))
