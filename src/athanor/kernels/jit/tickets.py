"""The atomic ticket by which the programs of one launch hand their partial results to the last of them.

Split-K GEMVs, the expert GEMV's sum over a token's experts, the one-kernel attention's merge of its splits,
and the GEMV epilogues (RoPE per head, routing per row) all end the same way: each program stores its part,
takes a ticket, and the program that takes the last one reads every part back (from L2: `.cg` loads), does
the reduction or the epilogue, and resets the counter for the next launch (CUDA-graph replays included).
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def last_of_group(TICKET, members):
    """Whether this program is the last of `members` to take the ticket at TICKET. The CTA barrier first makes
    every thread's stores issued before the ticket; the atomic is acq_rel, so the last program sees all the
    others' stores. The last one must `tl.atomic_xchg(TICKET, 0)` when it is done."""
    tl.debug_barrier()
    return tl.atomic_add(TICKET, 1) == members - 1
