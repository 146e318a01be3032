"""The keys and values of every slot, allocated through `ctx` so the engine accounts for their memory."""

from __future__ import annotations

from torch import Tensor

from athanor.model import BuildContext, ModelSpec
from athanor.moves.templates.fast.options import OPTIONS


class KVCache:
    """Per layer, k and v indexed as [max_seqs + 1, num_kv_heads, max_seq_len, head_dim] (for kv_layout
    "token_major" that is a permuted view of [slots, max_seq_len, heads, D] storage); slot max_seqs is the
    padding rows' scratch."""

    def __init__(self, spec: ModelSpec, ctx: BuildContext) -> None:
        self.k = [self._allocate(spec, ctx) for _ in range(spec.num_layers)]
        self.v = [self._allocate(spec, ctx) for _ in range(spec.num_layers)]

    @staticmethod
    def _allocate(s: ModelSpec, c: BuildContext) -> Tensor:
        if OPTIONS["kv_layout"] == "token_major":  # [slots, L, Hkv, D]: each token's heads are adjacent
            return c.allocate((c.max_seqs + 1, c.max_seq_len, s.num_kv_heads, s.head_dim)).transpose(1, 2)
        return c.allocate((c.max_seqs + 1, s.num_kv_heads, c.max_seq_len, s.head_dim))

    def write(self, i: int, slots: Tensor, positions: Tensor, k: Tensor, v: Tensor) -> None:
        """Layer i's new keys and values k, v [B, Hkv, D], each row's at its slot and position."""
        self.k[i][slots, :, positions] = k
        self.v[i][slots, :, positions] = v
