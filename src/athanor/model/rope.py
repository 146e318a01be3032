"""Rotary position embedding as HF computes it: the inverse frequencies of a spec's `rope_theta` and `rope_scaling`
(llama3, linear, YaRN), the cos and sin tables, and their application in the rotate-half layout. A model whose
windowed layers have a RoPE base of their own (Gemma 3's local layers: `ModelSpec.local_rope_theta`) has a second
table, unscaled."""

from __future__ import annotations

import math

import torch
from torch import Tensor

from athanor.model.spec import ModelSpec, RopeScaling


def rope_inv_freq(spec: ModelSpec, local: bool = False) -> Tensor:
    """Inverse frequencies [head_dim / 2] fp32, scaled as the spec's `rope_scaling` says; `local`: of the windowed
    layers' own base, unscaled."""
    d = spec.rope_dim
    base = spec.local_rope_theta if local else spec.rope_theta
    inv_freq = 1.0 / (base ** (torch.arange(0, d, 2, dtype=torch.int64).float() / d))
    s = spec.rope_scaling
    if s is None or local:
        return inv_freq
    if s.kind == "linear":
        return inv_freq / s.factor
    if s.kind == "yarn":
        return yarn_inv_freq(inv_freq, s, spec.rope_theta)
    low_wavelen = s.original_max_position_embeddings / s.low_freq_factor
    high_wavelen = s.original_max_position_embeddings / s.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_wavelen, inv_freq / s.factor, inv_freq)
    smooth = (s.original_max_position_embeddings / wavelen - s.low_freq_factor) / (
        s.high_freq_factor - s.low_freq_factor
    )
    smoothed = (1 - smooth) * scaled / s.factor + smooth * scaled
    is_medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return torch.where(is_medium, smoothed, scaled)


def yarn_inv_freq(inv_freq: Tensor, s: RopeScaling, base: float) -> Tensor:
    """YaRN (Peng et al., 2023): a dimension that turns fewer than `beta_slow` times over the original context is
    interpolated (divided by the factor), one that turns more than `beta_fast` times kept, and those between blend
    linearly in their index."""
    d = 2 * inv_freq.shape[0]

    def dim_turning(turns: float) -> float:  # the dimension that turns `turns` times over the original context
        return d * math.log(s.original_max_position_embeddings / (turns * 2 * math.pi)) / (2 * math.log(base))

    low, high = dim_turning(s.beta_fast), dim_turning(s.beta_slow)
    if s.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, d - 1)
    ramp = ((torch.arange(d // 2, dtype=torch.float32) - low) / max(high - low, 1e-3)).clamp(0, 1)
    return inv_freq / s.factor * ramp + inv_freq * (1 - ramp)


def rope_tables(spec: ModelSpec, length: int, device: torch.device, dtype: torch.dtype,
                local: bool = False) -> tuple[Tensor, Tensor]:
    """cos and sin [length, head_dim] of positions 0..length-1, times YaRN's attention factor where it applies."""
    freqs = torch.outer(torch.arange(length, dtype=torch.float32), rope_inv_freq(spec, local))
    emb = torch.cat((freqs, freqs), dim=-1)
    scale = spec.rope_scaling.attention_factor if spec.rope_scaling is not None and not local else 1.0
    return ((emb.cos() * scale).to(device=device, dtype=dtype).contiguous(),
            (emb.sin() * scale).to(device=device, dtype=dtype).contiguous())


def rotate_half(x: Tensor) -> Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    # x: [N, heads, D]; cos, sin: [N, D]
    return x * cos[:, None, :] + rotate_half(x) * sin[:, None, :]


def apply_rope_interleaved(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """RoPE on adjacent pairs (x0, x1), (x2, x3), ... (DeepSeek's layout), written out as the halves' layout is:
    the pairs' first elements, then their second."""
    half = cos.shape[-1] // 2
    c, s = cos[:, None, :half], sin[:, None, :half]
    x1, x2 = x[..., 0::2], x[..., 1::2]
    return torch.cat((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1)
