"""The KV pool: every layer's pages of keys and values, allocated through `ctx` so the engine accounts for their
memory, and where a token's key goes (the engine's block table)."""

from __future__ import annotations

from torch import Tensor

from athanor.model import BuildContext, ModelSpec
from athanor.model.attention import token_pages
from athanor.moves.templates.fast.options import OPTIONS


class KVCache:
    """Per layer, k and v indexed as [num_pages + 1, num_kv_heads, page_size, head_dim] (for kv_layout "token_major"
    that is a permuted view of [pages, page_size, heads, D] storage: each token's heads adjacent, and a run of
    consecutive pages one stretch of tokens); page num_pages is scratch. Token p of slot s is in page
    table[s, p // page_size]."""

    def __init__(self, spec: ModelSpec, ctx: BuildContext) -> None:
        self.table, self.page_size = ctx.table, ctx.page_size
        self.k = [self._allocate(spec, ctx) for _ in range(spec.num_layers)]
        self.v = [self._allocate(spec, ctx) for _ in range(spec.num_layers)]

    @staticmethod
    def _allocate(s: ModelSpec, c: BuildContext) -> Tensor:
        if OPTIONS["kv_layout"] == "token_major":  # [pages, page_size, Hkv, D]
            return c.allocate((c.num_pages + 1, c.page_size, s.num_kv_heads, s.head_dim)).transpose(1, 2)
        return c.allocate((c.num_pages + 1, s.num_kv_heads, c.page_size, s.head_dim))

    def write(self, i: int, slots: Tensor, positions: Tensor, k: Tensor, v: Tensor) -> None:
        """Layer i's new keys and values k, v [N, Hkv, D], each row's at its slot's page for its position."""
        pages, rows = token_pages(self.table, slots, positions, self.page_size)
        self.k[i][pages, :, rows] = k
        self.v[i][pages, :, rows] = v
