"""Greedy decoding on the device: a row-wise argmax over the vocabulary, split across programs.

One program per row would walk a 128k vocabulary alone (~125 dependent 4 KB loads, microseconds that a batch-1
step cannot spare). Instead each row is cut into PARTS chunks of CHUNK logits: every program finds
the first maximum of its chunk, stores (value, index), and takes the row's ticket; the last to take it reduces
the PARTS pairs (from L2) to the row's argmax and resets the ticket. One launch, graph-safe.
"""

from __future__ import annotations

import triton
import triton.language as tl

from athanor.kernels.jit.tickets import last_of_group


@triton.jit
def argmax_kernel(LOGITS, OUT, WS_VAL, WS_IDX, TICKETS, l_s0, V,
                  CHUNK: tl.constexpr, BLOCK: tl.constexpr, PARTS_P2: tl.constexpr, PDL: tl.constexpr):
    """Grid (rows, cdiv(V, CHUNK)); CHUNK a multiple of BLOCK. Ties go to the smallest index, as torch.argmax's
    (NaN is never a maximum here, unlike there)."""
    if PDL:  # launched before the LM head ends: resident and waiting, not launching, when the logits are done
        tl.extra.cuda.gdc_wait()
    row = tl.program_id(0).to(tl.int64)  # rows x vocab may pass 2^31
    part = tl.program_id(1)
    parts = tl.num_programs(1)
    offs = tl.arange(0, BLOCK)
    best_val = tl.full([BLOCK], float("-inf"), tl.float32)
    best_idx = tl.full([BLOCK], V, tl.int32)
    for v0 in tl.static_range(0, CHUNK, BLOCK):
        ids = part * CHUNK + v0 + offs
        x = tl.load(LOGITS + row * l_s0 + ids, mask=ids < V, other=float("-inf")).to(tl.float32)
        take = ((x > best_val) | ((x == best_val) & (ids < best_idx))) & (ids < V)  # strict, then the earliest
        best_idx = tl.where(take, ids, best_idx)
        best_val = tl.where(take, x, best_val)
    top = tl.max(best_val, axis=0)
    tl.store(WS_VAL + row * parts + part, top)
    tl.store(WS_IDX + row * parts + part, tl.min(tl.where(best_val == top, best_idx, V), axis=0))
    if last_of_group(TICKETS + row, parts):
        p = tl.arange(0, PARTS_P2)
        vals = tl.load(WS_VAL + row * parts + p, mask=p < parts, other=float("-inf"), cache_modifier=".cg")
        idxs = tl.load(WS_IDX + row * parts + p, mask=p < parts, other=V, cache_modifier=".cg")
        top = tl.max(vals, axis=0)
        tl.store(OUT + row, tl.min(tl.where(vals == top, idxs, V), axis=0).to(tl.int64))
        tl.atomic_xchg(TICKETS + row, 0)
