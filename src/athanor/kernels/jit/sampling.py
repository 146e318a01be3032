"""Greedy decoding on the device: a row-wise argmax over the vocabulary in BLOCK-sized strides."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def argmax_kernel(LOGITS, OUT, l_s0, V, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)  # rows x vocab may pass 2^31
    offs = tl.arange(0, BLOCK)
    best_val = tl.full([BLOCK], float("-inf"), tl.float32)
    best_idx = tl.zeros([BLOCK], tl.int64)
    for v0 in range(0, V, BLOCK):
        ids = v0 + offs
        x = tl.load(LOGITS + row * l_s0 + ids, mask=ids < V, other=float("-inf")).to(tl.float32)
        better = x > best_val  # strict: the earliest index wins a tie, as torch.argmax
        best_idx = tl.where(better, ids.to(tl.int64), best_idx)
        best_val = tl.where(better, x, best_val)
    top = tl.max(best_val, axis=0)
    # Several lanes may hold the maximum: take the smallest index among them.
    idx = tl.min(tl.where(best_val == top, best_idx, V), axis=0)
    tl.store(OUT + row, idx)
