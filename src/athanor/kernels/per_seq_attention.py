"""Decode attention one sequence at a time over views of its own cached keys and values (PyTorch).

The batched fallback (`attention.decode_attention_torch`) gathers every row's cache up to the
longest context with `index_select`: a copy of B x L x heads x D per layer, read twice more by
the two matmuls. Slicing `k_cache[slot, :, :len]` is a view, so this reads each sequence's keys
once and only up to its own length. It loops over the batch on the host (`.tolist()`), so it is
not CUDA-graph safe: it is the CPU's answer, where there are no graphs and memory traffic is
everything (x2-7 faster per layer at batch 8-32 and 1-2k context on the CPU here).
"""

from __future__ import annotations

import torch
from torch import Tensor


def decode_attention_per_seq(q: Tensor, k_cache: Tensor, v_cache: Tensor, slots: Tensor, kv_lens: Tensor) -> Tensor:
    """Grouped-query decode attention. Returns [B, Hq, D].

    q: [B, Hq, D]; k_cache, v_cache: [slots, Hkv, max_seq_len, D] (any strides); slots, kv_lens: [B] int64.
    """
    _, hq, d = q.shape
    hkv = k_cache.shape[1]
    out = torch.empty_like(q)
    for row, (slot, n) in enumerate(zip(slots.tolist(), kv_lens.tolist())):
        keys, values = k_cache[slot, :, :n], v_cache[slot, :, :n]  # [Hkv, n, D] views
        qg = q[row].view(hkv, hq // hkv, d)  # query heads sharing one KV head are adjacent
        scores = (qg @ keys.transpose(-1, -2)).float() * d**-0.5  # [Hkv, G, n]
        probs = torch.softmax(scores, dim=-1).to(values.dtype)
        out[row] = (probs @ values).reshape(hq, d)
    return out
