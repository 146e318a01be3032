"""Split-KV flash-decoding with GQA over the paged KV cache.

Grid (batch, kv heads, splits). Each program takes the query heads that share one KV head (a
[G, D] tile, padded to 16 rows for tl.dot) and one slice of its sequence's keys, and writes a
partial output and log-sum-exp. The slice length is derived *inside* the kernel from the
sequence's own length (cdiv(kv_len, splits)), so the grid is static (CUDA-graph safe) while every
split has work whether the context is 100 or 100k tokens.

The keys live in a pool of pages: key p of slot s is row p % PAGE_SIZE of page BT[s, p // PAGE_SIZE].
A tile that lies in one page (PAGE_SIZE a multiple of BLOCK_N) reads one table entry, a narrower
page an entry per key; entries past the sequence's length are never read.

The splits are merged by their log-sum-exp either by `decode_attention_merge_kernel` (grid
(batch, q heads)) or, under MERGE, by the last split program of each (sequence, KV head) to
finish, found by an atomic ticket as in the split-K GEMVs: one launch instead of two.

Under ROPE the kernel also does what `rope_and_cache` does before it: it rotates (and under QK_NORM
RMS-norms) the raw q in registers, and the program whose slice holds the new token's position
writes the rotated k and the v into the cache (at the position's page) before reading its slice. So a
decode layer's attention is one kernel between the QKV and O projections.
"""

from __future__ import annotations

import triton
import triton.language as tl

from athanor.kernels.jit.tickets import last_of_group


@triton.jit
def rope_rows(ROWS, row_offs, mask, d, cos, sin, NW, eps, QK_NORM: tl.constexpr, HEAD_DIM: tl.constexpr):
    """Rows ROWS + row_offs[r] of a head ([R, HEAD_DIM] in ROWS' dtype) rotated in HF's rotate-half
    layout by cos/sin ([HEAD_DIM] fp32: the position's table rows), in fp32 and rounded once; under
    QK_NORM each row is first RMS-normed with NW, rounded as `rms_norm` rounds ((x * rstd) to the
    dtype, times w). Rows outside `mask` ([R, 1]) come back as zeros."""
    partner = (d + HEAD_DIM // 2) % HEAD_DIM  # rotate_half(x)[d] = -x[d + D/2] (first half), x[d - D/2]
    ptrs = ROWS + row_offs[:, None]
    # From L2 (.cg): the rows may have been written by other programs of the same launch (`rope_head`).
    x = tl.load(ptrs + d[None, :], mask=mask, other=0.0, cache_modifier=".cg")
    dtype = x.dtype
    xf = x.to(tl.float32)
    xp = tl.load(ptrs + partner[None, :], mask=mask, other=0.0, cache_modifier=".cg").to(tl.float32)
    if QK_NORM:
        rstd = 1.0 / tl.sqrt(tl.sum(xf * xf, axis=1) / HEAD_DIM + eps)[:, None]
        w = tl.load(NW + d).to(tl.float32)[None, :]
        wp = tl.load(NW + partner).to(tl.float32)[None, :]
        xf = (w * (xf * rstd).to(dtype).to(tl.float32)).to(dtype).to(tl.float32)
        xp = (wp * (xp * rstd).to(dtype).to(tl.float32)).to(dtype).to(tl.float32)
    sign = tl.where(d < HEAD_DIM // 2, -1.0, 1.0)[None, :]
    return tl.where(mask, xf * cos[None, :] + sign * xp * sin[None, :], 0.0).to(dtype)


@triton.jit
def token_offset(BT, bt_s0, slot, pos, c_s0, c_s2, PAGE_SIZE: tl.constexpr):
    """Where token `pos` (a scalar) of slot `slot` sits in the pool, past its KV head's offset: page
    BT[slot, pos // PAGE_SIZE] times the page stride c_s0 plus row pos % PAGE_SIZE times the row stride c_s2 (int64)."""
    page = tl.load(BT + slot.to(tl.int64) * bt_s0 + pos // PAGE_SIZE).to(tl.int64)
    return page * c_s0 + (pos % PAGE_SIZE).to(tl.int64) * c_s2


@triton.jit
def decode_attention_split_kernel(
    Q, K_CACHE, V_CACHE, SLOTS, BT, KV_LENS, O_PART, LSE_PART, OUT, TICKETS,
    K_NEW, V_NEW, COS, SIN, POS, QN, KN, eps,
    q_s0, q_s1, kn_s0, kn_s1, vn_s0, vn_s1, c_s0, c_s1, c_s2, bt_s0, o_s0, o_s1, o_s2, l_s0, l_s1, out_s0, out_s1,
    scale,
    GROUP: tl.constexpr, NUM_SPLITS: tl.constexpr, HEAD_DIM: tl.constexpr,
    BLOCK_G: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_S: tl.constexpr,
    S_CHUNK: tl.constexpr, PAGE_SIZE: tl.constexpr, ROPE: tl.constexpr, QK_NORM: tl.constexpr, MERGE: tl.constexpr,
    PDL: tl.constexpr,
    LENS_OFFSET: tl.constexpr = 0, EARLY_KEYS: tl.constexpr = False, TRIGGER: tl.constexpr = False,
):
    if PDL and TRIGGER:  # the merge kernel's programs may become resident now and wait (`split_early`)
        tl.extra.cuda.gdc_launch_dependents()
    if PDL and not EARLY_KEYS:  # programmatic dependent launch: wait for the kernel that wrote q and the cache
        tl.extra.cuda.gdc_wait()
    b = tl.program_id(0)
    hk = tl.program_id(1)
    split = tl.program_id(2)
    slot = tl.load(SLOTS + b)
    kv_len = tl.load(KV_LENS + b).to(tl.int32) + LENS_OFFSET  # positions + 1, say, with no launch to add it
    chunk = tl.cdiv(tl.cdiv(kv_len, NUM_SPLITS), BLOCK_N) * BLOCK_N
    start = split * chunk
    end = tl.minimum(start + chunk, kv_len)

    g = tl.arange(0, BLOCK_G)
    d = tl.arange(0, HEAD_DIM)
    heads = hk * GROUP + g
    g_mask = g < GROUP
    head = hk.to(tl.int64) * c_s1  # this program's KV head in every page
    bt_row = BT + slot.to(tl.int64) * bt_s0  # its sequence's pages
    if ROPE:
        pos = tl.load(POS + b)
        cos = tl.load(COS + pos * HEAD_DIM + d).to(tl.float32)
        sin = tl.load(SIN + pos * HEAD_DIM + d).to(tl.float32)
        q = rope_rows(Q + b * q_s0, heads * q_s1, g_mask[:, None], d, cos, sin, QN, eps, QK_NORM, HEAD_DIM)
        if (pos >= start) & (pos < end):  # this slice reads the new token: write it to the cache first
            one = tl.zeros([1], tl.int32)
            k_new = rope_rows(K_NEW + b * kn_s0 + hk * kn_s1, one, one[:, None] == 0, d, cos, sin, KN, eps,
                              QK_NORM, HEAD_DIM)
            new_offs = token_offset(BT, bt_s0, slot, pos, c_s0, c_s2, PAGE_SIZE) + head + d[None, :]
            tl.store(K_CACHE + new_offs, k_new)
            tl.store(V_CACHE + new_offs, tl.load(V_NEW + b * vn_s0 + hk * vn_s1 + one[:, None] + d[None, :]))
        tl.debug_barrier()  # the whole program sees those stores before its loop reads them back
    elif EARLY_KEYS:
        # The split's first tile of keys and values, but for the row's newest key, was written by earlier steps: in
        # flight before the wait (see `decode_attention(early_keys=True)`); the newest key's row read after it.
        k_first, v_first, first_mask, kv_offs = _kv_tile(K_CACHE, V_CACHE, bt_row, head, start, end, c_s0, c_s2, d,
                                                         BLOCK_N, PAGE_SIZE)
        if PDL:
            tl.extra.cuda.gdc_wait()
        newest = (start + tl.arange(0, BLOCK_N) == kv_len - 1)[:, None]
        k_first = tl.where(newest, tl.load(K_CACHE + kv_offs, mask=newest, other=0.0), k_first)
        v_first = tl.where(newest, tl.load(V_CACHE + kv_offs, mask=newest, other=0.0), v_first)
    if not ROPE:
        q = tl.load(Q + b * q_s0 + heads[:, None] * q_s1 + d[None, :], mask=g_mask[:, None], other=0.0)  # [G, D]

    m_i = tl.full([BLOCK_G], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_G], tl.float32)
    acc = tl.zeros([BLOCK_G, HEAD_DIM], tl.float32)
    loop_start = start
    if EARLY_KEYS:
        if start < end:  # a split past the row's keys has none, and keeps m_i at -inf
            m_i, l_i, acc = _attend_tile(q, k_first, v_first, first_mask, m_i, l_i, acc, scale)
        loop_start = start + BLOCK_N
    for n0 in range(loop_start, end, BLOCK_N):
        k, v, n_mask, _ = _kv_tile(K_CACHE, V_CACHE, bt_row, head, n0, end, c_s0, c_s2, d, BLOCK_N, PAGE_SIZE)
        m_i, l_i, acc = _attend_tile(q, k, v, n_mask, m_i, l_i, acc, scale)

    has_keys = l_i > 0
    out = acc / tl.where(has_keys, l_i, 1.0)[:, None]
    if MERGE and NUM_SPLITS == 1:  # nothing to merge: the output directly
        tl.store(OUT + b * out_s0 + heads[:, None] * out_s1 + d[None, :], out.to(OUT.dtype.element_ty),
                 mask=g_mask[:, None])
    else:
        lse = tl.where(has_keys, m_i + tl.log(tl.where(has_keys, l_i, 1.0)), float("-inf"))
        o_ptrs = O_PART + b * o_s0 + heads[:, None] * o_s1 + split * o_s2 + d[None, :]
        tl.store(o_ptrs, out, mask=g_mask[:, None])
        tl.store(LSE_PART + b * l_s0 + heads * l_s1 + split, lse, mask=g_mask)
        if MERGE:
            ticket_ptr = TICKETS + b * tl.num_programs(1) + hk
            if last_of_group(ticket_ptr, NUM_SPLITS):  # the last split sees every partial
                hh = tl.arange(0, BLOCK_H)
                merge_heads(O_PART + b * o_s0, LSE_PART + b * l_s0, OUT + b * out_s0, hk * GROUP + hh, hh < GROUP,
                            o_s1, o_s2, l_s1, out_s1, NUM_SPLITS, BLOCK_H, BLOCK_S, S_CHUNK, HEAD_DIM)
                tl.atomic_xchg(ticket_ptr, 0)  # ready for the next launch (CUDA-graph replays included)


@triton.jit
def _kv_tile(K_CACHE, V_CACHE, bt_row, head, n0, end, c_s0, c_s2, d, BLOCK_N: tl.constexpr, PAGE_SIZE: tl.constexpr):
    """Keys n0 .. n0 + BLOCK_N (n0 a multiple of BLOCK_N) of the sequence whose block-table row is bt_row, at the KV
    head whose offset in a page is `head`: k, v [N, D] (zeros from `end` on), the live-key mask [N] and the tile's
    offsets into the caches (for a row read again). Only the table entries of keys before `end` are read."""
    offs = n0 + tl.arange(0, BLOCK_N)
    n_mask = offs < end
    if PAGE_SIZE % BLOCK_N == 0:
        # The tile lies in one page. Its entry is the sequence's even for a tile wholly past `end` (an EARLY_KEYS
        # split with no keys): end - 1 < kv_len, the first key's entry then.
        first = tl.maximum(tl.minimum(n0, end - 1), 0)
        page = tl.load(bt_row + first // PAGE_SIZE).to(tl.int64)
        rows = page * c_s0 + (n0 % PAGE_SIZE + tl.arange(0, BLOCK_N)).to(tl.int64) * c_s2
    else:
        page = tl.load(bt_row + offs // PAGE_SIZE, mask=n_mask, other=0).to(tl.int64)
        rows = page * c_s0 + (offs % PAGE_SIZE).to(tl.int64) * c_s2
    kv_offs = head + rows[:, None] + d[None, :]
    k = tl.load(K_CACHE + kv_offs, mask=n_mask[:, None], other=0.0)
    v = tl.load(V_CACHE + kv_offs, mask=n_mask[:, None], other=0.0)
    return k, v, n_mask, kv_offs


@triton.jit
def _attend_tile(q, k, v, n_mask, m_i, l_i, acc, scale):
    """The online softmax's step over one tile of keys k and values v ([N, D]; n_mask: the live ones) for the query
    rows q [G, D]: the running max m_i, sum l_i and output acc, updated."""
    scores = tl.dot(q, tl.trans(k)) * scale  # [G, N] fp32
    scores = tl.where(n_mask[None, :], scores, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(scores, axis=1))
    alpha = tl.exp(m_i - m_new)
    p = tl.exp(scores - m_new[:, None])
    l_i = l_i * alpha + tl.sum(p, axis=1)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
    return m_new, l_i, acc


@triton.jit
def merge_heads(PART, LSE, OUT, heads, h_mask, o_s1, o_s2, l_s1, out_s1, NUM_SPLITS: tl.constexpr,
                BLOCK_H: tl.constexpr, BLOCK_S: tl.constexpr, S_CHUNK: tl.constexpr, HEAD_DIM: tl.constexpr):
    """The outputs of BLOCK_H heads from their splits' partial outputs and log-sum-exps, every head's
    partials loaded together, S_CHUNK splits at a time (a [BLOCK_H, S_CHUNK, HEAD_DIM] tile: one L2 round
    trip per chunk, not one per head). Read from L2 (.cg): another program of the launch wrote them."""
    s = tl.arange(0, BLOCK_S)
    lse = tl.load(LSE + heads[:, None] * l_s1 + s[None, :], mask=h_mask[:, None] & (s < NUM_SPLITS)[None, :],
                  other=float("-inf"), cache_modifier=".cg")
    m = tl.where(h_mask, tl.max(lse, axis=1), 0.0)  # finite: split 0 always holds the sequence's first key
    denom = tl.where(h_mask, tl.sum(tl.exp(lse - m[:, None]), axis=1), 1.0)
    d = tl.arange(0, HEAD_DIM)
    acc = tl.zeros([BLOCK_H, HEAD_DIM], tl.float32)
    for s0 in tl.static_range(0, BLOCK_S, S_CHUNK):
        sc = s0 + tl.arange(0, S_CHUNK)
        mask = h_mask[:, None] & (sc < NUM_SPLITS)[None, :]
        lse_c = tl.load(LSE + heads[:, None] * l_s1 + sc[None, :], mask=mask, other=float("-inf"), cache_modifier=".cg")
        w = tl.exp(lse_c - m[:, None]) / denom[:, None]  # [H, S_CHUNK]
        parts = tl.load(PART + heads[:, None, None] * o_s1 + sc[None, :, None] * o_s2 + d[None, None, :],
                        mask=mask[:, :, None], other=0.0, cache_modifier=".cg")
        acc += tl.sum(parts * w[:, :, None], axis=1)
    tl.store(OUT + heads[:, None] * out_s1 + d[None, :], acc.to(OUT.dtype.element_ty), mask=h_mask[:, None])


@triton.jit
def decode_attention_merge_kernel(
    O_PART, LSE_PART, OUT,
    o_s0, o_s1, o_s2, l_s0, l_s1, out_s0, out_s1,
    NUM_SPLITS: tl.constexpr, BLOCK_S: tl.constexpr, S_CHUNK: tl.constexpr, HEAD_DIM: tl.constexpr,
    EARLY: tl.constexpr, PDL: tl.constexpr,
):
    if PDL:
        tl.extra.cuda.gdc_wait()
        if EARLY:  # the O projection's programs may become resident now and load their first weight tiles
            # (`decode_attention(merge_early=True)`)
            tl.extra.cuda.gdc_launch_dependents()
    b = tl.program_id(0)
    head = tl.program_id(1) + tl.arange(0, 1)
    merge_heads(O_PART + b * o_s0, LSE_PART + b * l_s0, OUT + b * out_s0, head, head >= 0, o_s1, o_s2, l_s1, out_s1,
                NUM_SPLITS, 1, BLOCK_S, S_CHUNK, HEAD_DIM)
