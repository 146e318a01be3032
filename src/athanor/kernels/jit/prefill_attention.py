"""Prefill attention for a packed batch of variable-length chunks, each continuing its slot's cached keys.

Grid (query blocks, sequences, query heads). A program takes BLOCK_M queries of one sequence and one head and
streams that sequence's keys and values from the paged KV pool (already holding the chunk's own keys) in
BLOCK_N tiles, flash-style: an online softmax in fp32, no scores in memory. Key p of slot s sits in page
BT[s, p // PAGE_SIZE], row p % PAGE_SIZE; a tile no wider than a page lies in one page and reads one table
entry, a wider one reads an entry per key. Query j of a chunk that starts at cached length `start` sits at
position start + j and sees keys 0..start + j, so the same kernel serves a fresh prompt (start 0) and any later
chunk of a long one. Tiles wholly below the block's first query need no mask and run in a loop of their own; only
the diagonal tiles pay for it, and they read neither the table nor the pool at or past the block's last key.

The first grid axis runs backwards: the last query blocks of a causal sequence have the most keys to read,
and starting them first keeps the tail of the launch short.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _tiles(acc, m_i, l_i, q, k_head, v_head, bt_row, q_pos, lo_key, hi_key, last_key, stride_kp, stride_kl,
           stride_vp, stride_vl, qk_scale,
           MASKED: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr, PAGE_SIZE: tl.constexpr):
    """Fold key tiles [lo_key, hi_key) into the running (acc, max, sum); under MASKED each query sees only keys at
    or before its position and below `last_key`. `k_head`, `v_head`: the pools at this program's KV head;
    `bt_row`: its slot's block-table row."""
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    for s in range(lo_key, hi_key, BLOCK_N):
        keys = s + offs_n
        in_seq = keys < last_key
        if PAGE_SIZE >= BLOCK_N:
            # Tiles start at multiples of BLOCK_N, so this one lies in one page; s < hi_key <= last_key, so its
            # entry is the sequence's.
            page = tl.load(bt_row + s // PAGE_SIZE).to(tl.int64)
            row = s % PAGE_SIZE + offs_n
        else:
            if MASKED:
                page = tl.load(bt_row + keys // PAGE_SIZE, mask=in_seq, other=0).to(tl.int64)
            else:
                page = tl.load(bt_row + keys // PAGE_SIZE).to(tl.int64)
            row = keys % PAGE_SIZE
        k_off = page * stride_kp + row * stride_kl  # [BLOCK_N] int64
        v_off = page * stride_vp + row * stride_vl
        if MASKED:
            k = tl.load(k_head + k_off[None, :] + offs_d[:, None], mask=in_seq[None, :], other=0.0)
        else:
            k = tl.load(k_head + k_off[None, :] + offs_d[:, None])
        qk = tl.dot(q, k) * qk_scale  # [BLOCK_M, BLOCK_N], in log2 units
        if MASKED:
            seen = (keys[None, :] <= q_pos[:, None]) & in_seq[None, :]
            qk = tl.where(seen, qk, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(qk, 1))
        p = tl.math.exp2(qk - m_new[:, None])
        alpha = tl.math.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        if MASKED:
            v = tl.load(v_head + v_off[:, None] + offs_d[None, :], mask=in_seq[:, None], other=0.0)
        else:
            v = tl.load(v_head + v_off[:, None] + offs_d[None, :])
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m_i = m_new
    return acc, m_i, l_i


@triton.jit
def prefill_attention_kernel(
    Q, K, V, OUT, CU, SLOTS, BT, STARTS,
    stride_qt, stride_qh, stride_kp, stride_kh, stride_kl, stride_vp, stride_vh, stride_vl, stride_ot, stride_oh,
    stride_bt,
    qk_scale,
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    PAGE_SIZE: tl.constexpr,
):
    mb = tl.num_programs(0) - 1 - tl.program_id(0)
    b = tl.program_id(1)
    h = tl.program_id(2)
    lo = tl.load(CU + b)
    n = tl.load(CU + b + 1) - lo
    if mb * BLOCK_M < n:
        start = tl.load(STARTS + b)
        slot = tl.load(SLOTS + b).to(tl.int64)
        kv_head = h // GROUP
        offs_m = mb * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_d = tl.arange(0, HEAD_DIM)
        rows = lo.to(tl.int64) + offs_m
        row_ok = offs_m < n
        q = tl.load(Q + rows[:, None] * stride_qt + h * stride_qh + offs_d[None, :], mask=row_ok[:, None],
                    other=0.0)
        q_pos = start + offs_m
        k_head = K + kv_head * stride_kh
        v_head = V + kv_head * stride_vh
        bt_row = BT + slot * stride_bt
        m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
        first_q = start + mb * BLOCK_M
        last_key = tl.minimum(first_q + BLOCK_M, start + n)  # one past the block's last real query's position
        below = ((first_q + 1) // BLOCK_N) * BLOCK_N  # tiles before this every query of the block sees whole
        acc, m_i, l_i = _tiles(acc, m_i, l_i, q, k_head, v_head, bt_row, q_pos, 0, below, last_key, stride_kp,
                               stride_kl, stride_vp, stride_vl, qk_scale,
                               MASKED=False, HEAD_DIM=HEAD_DIM, BLOCK_N=BLOCK_N, PAGE_SIZE=PAGE_SIZE)
        acc, m_i, l_i = _tiles(acc, m_i, l_i, q, k_head, v_head, bt_row, q_pos, below, last_key, last_key,
                               stride_kp, stride_kl, stride_vp, stride_vl, qk_scale,
                               MASKED=True, HEAD_DIM=HEAD_DIM, BLOCK_N=BLOCK_N, PAGE_SIZE=PAGE_SIZE)
        out = acc / l_i[:, None]
        tl.store(OUT + rows[:, None] * stride_ot + h * stride_oh + offs_d[None, :], out.to(OUT.dtype.element_ty),
                 mask=row_ok[:, None])
