"""Multi-head latent attention (DeepSeek-V2/V3) for the reference forward, computed as transformers does: the cache
holds each token's normed KV latent and its rotary key part (one "KV head" each), and every attention call expands
the cached latents into per-head keys and values. A faster forward may cache otherwise (the absorbed form, say):
the KV layout is the candidate's."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from athanor.model.model import Model
from athanor.model.rope import apply_rope, apply_rope_interleaved


def pool_dims(model: Model) -> tuple[int, int]:
    """Head dimensions of the two pools: the rotary key part, and the latent (in the values' pool)."""
    mla = model.spec.mla
    assert mla is not None
    return mla.rope_dim, mla.kv_rank


def qkv(model: Model, i: int, h: Tensor, cos: Tensor, sin: Tensor,
        norm: Callable[[Tensor, str], Tensor]) -> tuple[Tensor, Tensor, Tensor]:
    """For hidden states h [N, H] of layer i: the queries [N, heads, nope + rope] with RoPE on their rotary part,
    and what the cache keeps, the rotary key part [N, 1, rope] and the normed latent [N, 1, kv_rank]."""
    spec = model.spec
    mla = spec.mla
    assert mla is not None
    n = h.shape[0]
    if mla.q_rank:
        q = F.linear(norm(F.linear(h, model.layer(i, "q_a")), f"layers.{i}.q_a_norm"), model.layer(i, "q_b"))
    else:
        q = F.linear(h, model.layer(i, "wq"))
    q = q.view(n, spec.num_heads, mla.nope_dim + mla.rope_dim)
    latent, k_rot = F.linear(h, model.layer(i, "kv_a")).split([mla.kv_rank, mla.rope_dim], dim=-1)
    rope = apply_rope_interleaved if mla.interleave else apply_rope
    q_nope, q_rot = q.split([mla.nope_dim, mla.rope_dim], dim=-1)
    q = torch.cat((q_nope, rope(q_rot, cos, sin)), dim=-1)
    k_rot = rope(k_rot[:, None], cos, sin)
    return q, k_rot, norm(latent, f"layers.{i}.kv_a_norm")[:, None]


def expand(model: Model, i: int, k_rot: Tensor, latent: Tensor) -> tuple[Tensor, Tensor]:
    """Cached [B, 1, L, rope] rotary parts and [B, 1, L, kv_rank] latents of layer i as per-head keys
    [B, heads, L, nope + rope] and values [B, heads, L, v_dim]."""
    spec = model.spec
    mla = spec.mla
    assert mla is not None
    b, _, length, _ = latent.shape
    kv = F.linear(latent[:, 0], model.layer(i, "kv_b")).view(b, length, spec.num_heads, mla.nope_dim + mla.v_dim)
    k_nope, values = kv.transpose(1, 2).split([mla.nope_dim, mla.v_dim], dim=-1)
    keys = torch.cat((k_nope, k_rot.expand(-1, spec.num_heads, -1, -1)), dim=-1)
    return keys, values
