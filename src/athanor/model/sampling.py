"""Token sampling: greedy, temperature and top-p, with per-row seeds.

Written without host syncs or data-dependent shapes (the Gumbel/exponential-race trick
instead of `torch.multinomial`), so the engine can capture it in a CUDA graph with the step.
"""

from __future__ import annotations

import torch
from torch import Tensor


def sample(logits: Tensor, temperature: Tensor, top_p: Tensor, noise: Tensor | None = None) -> Tensor:
    """Next token ids [B] from logits [B, V].

    temperature: [B] fp32; 0 means greedy for that row.
    top_p:       [B] fp32 in (0, 1]; 1 keeps the whole distribution.
    noise:       [B, V] fp32 Exp(1) draws (from a seeded generator); required when any row samples.
    """
    logits = logits.float()
    greedy = logits.argmax(dim=-1)
    if noise is None:
        return greedy
    probs = torch.softmax(logits / temperature.clamp_min(1e-5)[:, None], dim=-1)
    sorted_probs, order = probs.sort(dim=-1, descending=True)
    # Keep the smallest prefix whose mass reaches top_p (the first token always stays).
    mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs
    sorted_probs = sorted_probs.masked_fill(mass_before >= top_p[:, None], 0.0)
    probs = torch.zeros_like(probs).scatter_(-1, order, sorted_probs)
    # argmax(p / E) with E ~ Exp(1) draws a token with probability proportional to p.
    drawn = (probs / noise).argmax(dim=-1)
    return torch.where(temperature > 0, drawn, greedy)


def exponential_noise(shape: tuple[int, int], generators: list[torch.Generator | None], device: torch.device) -> Tensor:
    """Exp(1) draws [B, V], each row from its own generator (per-request seeds)."""
    out = torch.empty(shape, device=device)
    for row, gen in enumerate(generators):
        out[row].exponential_(generator=gen)
    return out
