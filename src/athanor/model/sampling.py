"""Sampling inside the captured decode step: greedy, temperature and top-p, seeded per row.

Everything here has static shapes and no host synchronisation, so it is captured in the same
CUDA graph as the candidate's `decode`. Randomness comes from a counter-based hash of
(seed, position, token id) instead of a torch Generator: the same request samples the same
tokens on every candidate, at every batch position and across graph replays, which is what an
A/B comparison of two candidates needs.
"""

from __future__ import annotations

import torch
from torch import Tensor

_MASK31 = (1 << 31) - 1


def _mix(x: Tensor) -> Tensor:
    # An integer hash (two multiply-xorshift rounds); values stay below 2**62, so int64 never overflows.
    x = x & _MASK31
    x = ((x >> 16) ^ x) * 0x45D9F3B & _MASK31
    x = ((x >> 16) ^ x) * 0x45D9F3B & _MASK31
    return (x >> 16) ^ x


def uniform_noise(seeds: Tensor, positions: Tensor, vocab_size: int) -> Tensor:
    """Uniform numbers in (0, 1), [B, vocab] fp32, a pure function of (seed, position, token id)."""
    # seeds, positions: [B] int64
    row = _mix(_mix(seeds & _MASK31) ^ (positions & _MASK31))
    ids = torch.arange(vocab_size, device=seeds.device, dtype=torch.int64)
    bits = _mix(row[:, None] * 65599 + ids[None, :]) & ((1 << 24) - 1)
    # 24 bits are exact in fp32, and the half-step offset keeps the values off 0 and 1.
    return (bits.to(torch.float32) + 0.5) / float(1 << 24)


def sample(logits: Tensor, temperature: Tensor, top_p: Tensor, seeds: Tensor, positions: Tensor) -> Tensor:
    """Next tokens [B] int64 from logits [B, vocab].

    temperature [B] fp32 (<= 0: greedy), top_p [B] fp32 in (0, 1], seeds [B] int64,
    positions [B] int64 (the position of the token being fed, which makes each step's draw fresh).
    """
    logits = logits.float()
    greedy = torch.argmax(logits, dim=-1)
    if not (logits.is_cuda and torch.cuda.is_current_stream_capturing()):
        # Eagerly a host check is free: skip work whose result is known. The sort below keeps
        # every token when top_p >= 1, and each token meets its own noise either way, so skipping
        # it draws the same tokens.
        if bool((temperature <= 0).all()):
            return greedy
        if bool((top_p >= 1).all()):
            race = torch.softmax(logits / torch.clamp(temperature, min=1e-5)[:, None], dim=-1) / (
                -torch.log(uniform_noise(seeds, positions, logits.shape[-1])))
            return torch.where(temperature > 0, torch.argmax(race, dim=-1), greedy)
    temp = torch.clamp(temperature, min=1e-5)[:, None]
    probs = torch.softmax(logits / temp, dim=-1)
    sorted_probs, sorted_ids = torch.sort(probs, dim=-1, descending=True)
    # Keep the smallest prefix whose mass reaches top_p (the first token always stays).
    before = torch.cumsum(sorted_probs, dim=-1) - sorted_probs
    sorted_probs = torch.where(before < top_p[:, None], sorted_probs, torch.zeros_like(sorted_probs))
    # Exponential race: argmax p_i / E_i with E_i ~ Exp(1) draws i with probability p_i.
    noise = uniform_noise(seeds, positions, logits.shape[-1]).gather(1, sorted_ids)
    race = sorted_probs / (-torch.log(noise))
    choice = torch.gather(sorted_ids, 1, torch.argmax(race, dim=-1, keepdim=True))[:, 0]
    return torch.where(temperature > 0, choice, greedy)
