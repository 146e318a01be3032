"""The atomic ticket by which the programs of one launch hand their partial results to the last of them; and the
flag by which one launch hands its result to the programs of the next before it has ended.

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


@triton.jit
def raise_flag(FLAG):
    """Set FLAG once every thread of this program has stored what it guards (the barrier, then a release at GPU
    scope): a program that then sees it set with `wait_flag` sees those stores."""
    tl.debug_barrier()
    tl.atomic_xchg(FLAG, 1, sem="release")


@triton.jit
def wait_flag(FLAG, SPINS: tl.constexpr):
    """Poll FLAG (an acquiring load, ~100 ns apart) until a program of the launch before raises it, so this program
    goes on as soon as that program's stores are in L2, not when its whole launch has ended (programmatic dependent
    launch's `gdc_wait`). After SPINS polls it waits for the launch before instead, which is always sound. Only
    under PDL: the launch before is then resident (it let this one launch), so the flag is raised without this
    launch's help."""
    seen = _acquire(FLAG)
    spins = 0
    while (seen == 0) & (spins < SPINS):
        spins += pause()
        seen = _acquire(FLAG)
    if seen == 0:
        tl.extra.cuda.gdc_wait()


@triton.jit
def _acquire(FLAG):
    return tl.inline_asm_elementwise("ld.acquire.gpu.global.b32 $0, [$1];", "=r,l", [FLAG], dtype=tl.int32,
                                     is_pure=False, pack=1)


@triton.jit
def pause():
    """About 100 ns of sleep between two polls (hundreds of programs polling one address without pause queue in
    front of the store they wait for). Returns 1."""
    return tl.inline_asm_elementwise("nanosleep.u32 100;\n mov.u32 $0, 1;", "=r,r", [tl.program_id(0)],
                                     dtype=tl.int32, is_pure=False, pack=1)
