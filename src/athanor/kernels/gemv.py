"""Linear layers for decode: cuBLAS, or a Triton split-K skinny GEMM for a handful of rows.

cuBLAS is strong at M >= 16 and at large N; at M = 1..8 on narrow projections its GEMV can leave
SMs idle, which split-K fixes. Whether it wins is a per-shape, per-device measurement: the
templates make it a choice (`gemv` option) rather than a rule.
"""

from __future__ import annotations

from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import Tensor

from athanor.errors import ConfigError
from athanor.kernels.attention import _num_sms
from athanor.kernels.dispatch import (
    ARGMAX_SLOTS,
    WARPS,
    Impl,
    argmax_best,
    cdiv,
    check_choice,
    interpreting,
    next_pow2,
    pdl,
    router_sums,
    rstd_block,
    tickets,
    use_triton,
)
from athanor.kernels.embedding import embedding
from athanor.kernels.moe import route
from athanor.kernels.norm import rms_norm_torch
from athanor.kernels.rope import KVWrite, rope_into

MAX_ROWS = 16
"""Largest row count the split-K path takes; above it `linear` uses cuBLAS."""
BLOCK_N, BLOCK_K = 64, 128


def splitk_linear(x: Tensor, w: Tensor, bias: Tensor | None = None, split_k: int | None = None,
                  impl: Impl = None) -> Tensor:
    """x @ w.T (+ bias). x: [M, K] with M <= 16; w: [N, K] row-major. Returns [M, N] in x's dtype."""
    if not use_triton(x, impl):
        return F.linear(x, w, bias)
    from athanor.kernels.jit.gemv import splitk_gemm_kernel

    m, k = x.shape
    n = w.shape[0]
    assert m <= MAX_ROWS and w.stride(1) == 1
    if x.stride(1) != 1:
        x = x.contiguous()
    strips = cdiv(n, BLOCK_N)
    if split_k is None:
        split_k = max(1, min(cdiv(2 * _num_sms(x.device), strips), k // (4 * BLOCK_K)))
    k_per_split = cdiv(cdiv(k, split_k), BLOCK_K) * BLOCK_K
    split_k = cdiv(k, k_per_split)
    if split_k == 1:
        out = torch.empty((m, n), dtype=x.dtype, device=x.device)
        o_s0, o_s1 = 0, out.stride(0)
    else:
        out = torch.empty((split_k, m, n), dtype=torch.float32, device=x.device)
        o_s0, o_s1 = out.stride(0), out.stride(1)
    splitk_gemm_kernel[(strips, split_k)](
        x, w, out, m, n, k, k_per_split, x.stride(0), w.stride(0), o_s0, o_s1,
        BLOCK_M=max(16, next_pow2(m)), BLOCK_N=BLOCK_N, BLOCK_K=BLOCK_K,
    )
    y = out if split_k == 1 else out.sum(0).to(x.dtype)
    return y if bias is None else y + bias


def linear(x: Tensor, w: Tensor, bias: Tensor | None = None, gemv: str = "cublas") -> Tensor:
    """x @ w.T (+ bias) with the `gemv` choice: "cublas" (F.linear) or "triton_splitk" for <= 16 rows."""
    if gemv == "triton_splitk" and x.dim() == 2 and x.shape[0] <= MAX_ROWS and use_triton(x):
        return splitk_linear(x, w, bias)
    return F.linear(x, w, bias)


MAX_FUSED_ROWS = 8
"""Most rows `fused_linear` takes in Triton: each row is one more pass over the weight tile in registers."""


def fused_linear(x: Tensor, w: Tensor, bias: Tensor | None = None, *, norm_weight: Tensor | None = None,
                 eps: float = 0.0, up: Tensor | None = None, residual: Tensor | None = None,
                 impl: Impl = None, evict_first: bool = False) -> Tensor:
    """A projection with what surrounds it in a decode layer, in one kernel for <= 8 rows:

        a = rms_norm(x, norm_weight, eps)   if norm_weight is given (x is the residual stream)
          = silu(x) * up                    if up is given (x is the gate projection's output)
          = x                               otherwise
        y = a @ w.T (+ bias), rounded to the model dtype, then (+ residual) if given.

    x, up, residual: [M, K] / [M, N] rows (any row stride); w: [N, K] row-major. The PyTorch path
    composes the same rounding steps (`rms_norm_torch`, F.silu(x) * up, F.linear, +) and serves any M.
    `evict_first` (a hint; no value changes): the kernel reads w with L2's evict-first policy (read once a step).
    """
    assert norm_weight is None or up is None, "a projection takes a norm or a SiLU prologue, not both"
    m, k = x.shape
    n = w.shape[0]
    if m > MAX_FUSED_ROWS or not use_triton(x, impl):
        if norm_weight is not None:
            x = rms_norm_torch(x, norm_weight, eps)
        elif up is not None:
            x = F.silu(x) * up
        y = F.linear(x, w, bias)
        return y if residual is None else y + residual
    from athanor.kernels.jit.fused_gemv import fused_gemv_kernel, fused_gemv_tuned

    assert w.stride(1) == 1 and x.stride(1) == 1 and (up is None or up.stride(1) == 1)
    assert residual is None or residual.stride(1) == 1
    y = torch.empty((m, n), dtype=x.dtype, device=x.device)
    if m == 0:
        return y
    args = (x, up if up is not None else x, w, bias if bias is not None else w,
            norm_weight if norm_weight is not None else w, residual if residual is not None else y, y,
            _workspace(m, n, x.device), tickets(x.device),
            m, n, k, eps, x.stride(0), up.stride(0) if up is not None else 0, w.stride(0),
            residual.stride(0) if residual is not None else 0, y.stride(0))
    flags = {"NORM": norm_weight is not None, "SILU": up is not None, "BIAS": bias is not None,
             "RESIDUAL": residual is not None}
    _launch(fused_gemv_kernel, fused_gemv_tuned, args, flags, m, n, k, evict_first=evict_first)
    return y


def fused_linear_argmax(x: Tensor, w: Tensor, norm_weight: Tensor, eps: float, impl: Impl = None,
                        evict_first: bool = False) -> tuple[Tensor, Tensor]:
    """A greedy decode step's LM head: (tokens [M] int64, logits [M, N]), logits = rms_norm(x, norm_weight, eps) @ w.T
    as `fused_linear` makes them and tokens their rows' argmax (the first maximum; NaN never one), for <= 8 rows in
    Triton (`fused_gemv_argmax_kernel`: each program's strip folded into the row's running maxima with an atomic,
    then `argmax_tokens_kernel`, one program, reads the tokens out), else `fused_linear` then `greedy`.
    `evict_first`: as `fused_linear`'s."""
    from athanor.kernels.sampling import greedy

    m, k = x.shape
    n = w.shape[0]
    if m > MAX_FUSED_ROWS or not use_triton(x, impl):
        logits = fused_linear(x, w, norm_weight=norm_weight, eps=eps, impl=impl, evict_first=evict_first)
        return greedy(logits, impl=impl), logits
    from athanor.kernels.jit.fused_gemv import (
        argmax_tokens_kernel,
        fused_gemv_argmax_kernel,
        fused_gemv_argmax_tuned,
    )

    assert w.stride(1) == 1 and x.stride(1) == 1
    y = torch.empty((m, n), dtype=x.dtype, device=x.device)
    tokens = torch.empty(m, dtype=torch.long, device=x.device)
    if m == 0:
        return tokens, y
    best = argmax_best(x.device)
    args = (x, w, norm_weight, y, _workspace(m, n, x.device), tickets(x.device), best,
            m, n, k, eps, x.stride(0), w.stride(0), y.stride(0))
    _launch(fused_gemv_argmax_kernel, fused_gemv_argmax_tuned, args, {"SLOTS": ARGMAX_SLOTS}, m, n, k,
            evict_first=evict_first)
    argmax_tokens_kernel[(1,)](best, tokens, m, BLOCK_M=next_pow2(m), SLOTS=ARGMAX_SLOTS, **pdl(x))
    return tokens, y


def qkv_rope_cache(h: Tensor, w: Tensor, bias: Tensor | None, norm_weight: Tensor, eps: float, num_heads: int,
                   cache: KVWrite, impl: Impl = None, gather: tuple[Tensor, Tensor] | None = None,
                   evict_first: bool = False) -> Tensor:
    """The decode step's attention input for <= 8 rows in one kernel: q, k, v = rms_norm(h) @ w.T (+ bias)
    (w: the fused [(Hq + 2 Hkv) * D, H] QKV weight), then what `rope_and_cache` does: q and k q/k-normed
    (when the cache carries the norms) and rotated, k and v written into the cache (at each position's page of
    `cache.block_table`). Returns q [M, Hq, D],
    rotated (a view of the QKV output: row stride (Hq + 2 Hkv) * D).

    In Triton the last strip of each head to be written rotates the head (a ticket per head, as split-K's),
    so RoPE costs no launch; its values are `rope_and_cache`'s on the same projection, bit for bit.

    `gather` = (tokens [M], out [M, H]), the first layer's: h is the token embedding [vocab, H] and the rows are
    h[tokens], also written into `out` (the residual stream); for one row in Triton inside the same kernel (no
    gather launch), else `embedding` first. `evict_first`: as `fused_linear`'s."""
    d = cache.k_cache.shape[-1]
    in_kernel = use_triton(h, impl) and d % (16 if interpreting() else 32) == 0  # BLOCK_N | head_dim
    if gather is not None and (gather[0].shape[0] != 1 or not in_kernel):  # the rows gathered first
        gather[1].copy_(embedding(gather[0], h, impl=impl))
        h, gather = gather[1], None
    m, k = h.shape if gather is None else (1, h.shape[1])
    num_kv = cache.k_cache.shape[1]
    n = w.shape[0]
    assert n == (num_heads + 2 * num_kv) * d, "w is not a fused QKV weight for these head counts"
    if m > MAX_FUSED_ROWS or not in_kernel:
        qkv = fused_linear(h, w, bias, norm_weight=norm_weight, eps=eps, impl=impl, evict_first=evict_first)
        q, kk, v = qkv.view(m, num_heads + 2 * num_kv, d).split([num_heads, num_kv, num_kv], dim=1)
        return rope_into(q, kk, v, cache, eps, impl=impl)
    from athanor.kernels.jit.fused_gemv import fused_gemv_rope_kernel, fused_gemv_rope_tuned

    assert w.stride(1) == 1 and h.stride(1) == 1 and cache.cos.is_contiguous() and cache.sin.is_contiguous()
    assert cache.k_cache.stride() == cache.v_cache.stride() and cache.k_cache.stride(3) == 1
    assert cache.v_cache.shape[2] == cache.k_cache.shape[2]
    y = torch.empty((m, n), dtype=h.dtype, device=h.device)
    norms = cache.q_norm is not None and cache.k_norm is not None
    c, table = cache.k_cache, cache.block_table
    args = (h, w, bias if bias is not None else w, norm_weight, y, _workspace(m, n, h.device), tickets(h.device),
            cache.cos, cache.sin, cache.positions, cache.slots, table, c, cache.v_cache,
            cache.q_norm if norms else cache.cos, cache.k_norm if norms else cache.cos,
            gather[0] if gather else cache.positions, gather[1] if gather else y,
            m, n, k, eps, h.stride(0), w.stride(0), y.stride(0), c.stride(0), c.stride(1), c.stride(2),
            table.stride(0), num_heads, num_kv)
    if m:
        _launch(fused_gemv_rope_kernel, fused_gemv_rope_tuned, args,
                {"HEAD_DIM": d, "PAGE_SIZE": c.shape[2], "QK_NORM": norms, "BIAS": bias is not None,
                 "GATHER": gather is not None}, m, n, k, early=False, evict_first=evict_first)
    return y.view(m, num_heads + 2 * num_kv, d)[:, :num_heads]


def router_topk(h: Tensor, w: Tensor, norm_weight: Tensor, eps: float, top_k: int, scoring: str, renormalize: bool,
                selection_bias: Tensor | None = None, impl: Impl = None) -> tuple[Tensor, Tensor]:
    """A MoE block's routing for <= 8 rows in one kernel: the router logits of rms_norm(h) (w: [E, H]), then
    what `route` does with them. Returns ids [M, k] int64 and weights [M, k] fp32.

    In Triton the last strip of the router GEMV to be written (a ticket over all strips) picks every row's
    top-k, so routing costs no launch; its values are `route`'s on the same logits, bit for bit."""
    m, k = h.shape
    n = w.shape[0]
    if m > MAX_FUSED_ROWS or not use_triton(h, impl) or scoring not in ("softmax", "sigmoid"):
        logits = fused_linear(h, w, norm_weight=norm_weight, eps=eps, impl=impl)
        return route(logits, top_k, scoring, renormalize, selection_bias, impl=impl)
    from athanor.kernels.jit.router_gemv import fused_gemv_route_kernel, fused_gemv_route_tuned

    assert w.stride(1) == 1 and h.stride(1) == 1
    y = torch.empty((m, n), dtype=h.dtype, device=h.device)
    ids = torch.empty((m, top_k), dtype=torch.long, device=h.device)
    weights = torch.empty((m, top_k), dtype=torch.float32, device=h.device)
    args = (h, w, norm_weight, y, _workspace(m, n, h.device), tickets(h.device),
            selection_bias if selection_bias is not None else y, ids, weights,
            m, n, k, eps, h.stride(0), w.stride(0), y.stride(0))
    flags = {"TOP_K": top_k, "SOFTMAX": scoring == "softmax", "RENORM": renormalize,
             "HAS_BIAS": selection_bias is not None, "BLOCK_E": next_pow2(n), "CHUNK": min(32, next_pow2(n))}
    if m:
        _launch(fused_gemv_route_kernel, fused_gemv_route_tuned, args, flags, m, n, k, early=False)
    return ids, weights


SUMS_SPREADS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
"""The distances `linear_route(sums_spread=)` may set between the router sums, in int64s."""


ROUTER_SCALE = 2.0**32
"""The fixed point of the router sums of `linear_route`: a logit's sum (before the RMSNorm's scale) is kept to
2^-32 and may reach 2^31 in magnitude (a share of one strip, |h * norm weight * router weight| summed over its
columns, to 2^31 too): far beyond any model's activations."""


def linear_route(x: Tensor, w: Tensor, residual: Tensor, router_w: Tensor, norm_weight: Tensor, eps: float, top_k: int,
                 scoring: str, renormalize: bool, selection_bias: Tensor | None = None,
                 impl: Impl = None, evict_first: bool = False, *, route_chunk: int | Literal["max"] = 32,
                 sums_spread: int = 128, route_warps: int = 4) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """The projection before a MoE block and the block's routing, for <= 8 rows in two kernels instead of three:

        h = residual + x @ w.T                    (rounded like `fused_linear(x, w, residual=residual)`)
        logits = rms_norm(h, norm_weight) @ router_w.T
        ids, weights = route(logits, top_k, scoring, renormalize, selection_bias)

    Returns (h, logits, ids [M, k] int64, weights [M, k] fp32). In Triton the router's GEMV costs no launch: as
    the projection writes a strip of h, the same program adds the strip's share of every row's logits into int64
    fixed-point sums (exact, so the same in whatever order the strips finish), and the routing kernel scales them by
    the row's RMSNorm factor, which comes out of the sum. So the logits are not the router GEMV's bit for bit: that
    one rounds the normed input to the model dtype before the product, this one multiplies in fp32; both round the
    logits to the model dtype. `evict_first`: the projection's as `fused_linear`'s.

    How the routing kernel runs (Triton only; no value changes; each default is the fastest decode step, as
    `athanor bench decode` measures it):
    - `route_chunk`: its experts' ranks counted against that many rivals at a time (a power of two), in a loop over
      choosers it stored (`rank_logits`); 0 all at once in registers; "max" in TOP_K rounds of one max.
    - `sums_spread`: the router sums this many int64s apart (one of `SUMS_SPREADS`; closer where the array holds no
      more): every O projection program adds into every expert's sum, and packed sums queue those atomics at the
      few L2 slices that hold them.
    - `route_warps`: its warps (one of `dispatch.WARPS`)."""
    # Checked before any launch: a bad value must not leave the sums added into.
    chunk = _route_chunk(route_chunk)
    spread = check_choice("sums_spread", sums_spread, SUMS_SPREADS, "int64s apart")
    warps = check_choice("route_warps", route_warps, WARPS, "warps")
    m, k = x.shape
    e, hidden = router_w.shape
    sums = router_sums(x.device)
    if (m > MAX_FUSED_ROWS or not use_triton(x, impl) or scoring not in ("softmax", "sigmoid")
            or m * e > sums.numel()):
        h = fused_linear(x, w, residual=residual, impl=impl, evict_first=evict_first)
        logits = fused_linear(h, router_w, norm_weight=norm_weight, eps=eps, impl=impl)
        return h, logits, *route(logits, top_k, scoring, renormalize, selection_bias, impl=impl)
    from athanor.kernels.jit.router_gemv import (
        fused_gemv_router_kernel,
        fused_gemv_router_tuned,
        route_sums_kernel,
    )

    n = w.shape[0]
    assert n == hidden and w.stride(1) == 1 and x.stride(1) == 1 and residual.stride(1) == 1
    assert router_w.is_contiguous()
    h = torch.empty((m, n), dtype=x.dtype, device=x.device)
    logits = torch.empty((m, e), dtype=x.dtype, device=x.device)
    ids = torch.empty((m, top_k), dtype=torch.long, device=x.device)
    weights = torch.empty((m, top_k), dtype=torch.float32, device=x.device)
    if m == 0:
        return h, logits, ids, weights
    block_e = next_pow2(e)
    while m * e * spread > sums.numel():  # as far apart as the array holds (qwen3's 128 experts: 1024 apart at one row)
        spread //= 2
    args = (x, w, residual, h, _workspace(m, n, x.device), tickets(x.device), router_w, norm_weight, sums,
            m, n, k, e, ROUTER_SCALE, x.stride(0), w.stride(0), residual.stride(0), h.stride(0))
    _launch(fused_gemv_router_kernel, fused_gemv_router_tuned, args, {"BLOCK_E": block_e, "SPREAD": spread}, m, n, k,
            evict_first=evict_first)
    route_sums_kernel[(m,)](
        sums, h, logits, selection_bias if selection_bias is not None else logits, ids, weights,
        torch.empty(m * block_e, dtype=torch.float32, device=x.device), e, n, eps,  # the ranks' scratch
        1.0 / ROUTER_SCALE, h.stride(0), TOP_K=top_k, SOFTMAX=scoring == "softmax", RENORM=renormalize,
        HAS_BIAS=selection_bias is not None, BLOCK_E=block_e,
        BLOCK_K=rstd_block(n), CHUNK=min(chunk, block_e), num_warps=warps, SPREAD=spread, **pdl(x))
    return h, logits, ids, weights


def _route_chunk(value: int | Literal["max"]) -> int:
    """`linear_route(route_chunk=)` as the kernel's CHUNK (-1 for "max"); a one-line error for anything else."""
    if value == "max":
        return -1
    if not isinstance(value, int) or value < 0 or value & (value - 1):
        raise ConfigError(f"route_chunk must be 0, a power of two or 'max', not {value!r}")
    return value


def _workspace(m: int, n: int, device: torch.device) -> Tensor:
    """fp32 partials of split-K configs: [SPLIT_K, strips, BLOCK_M, BLOCK_N] fits in max split x M x N rounded up."""
    return torch.empty(8 * next_pow2(m) * (n + 64), dtype=torch.float32, device=device)


def _launch(kernel: Any, tuned: Any, args: tuple[Any, ...], flags: dict[str, Any], m: int, n: int, k: int,
            early: bool = True, evict_first: bool = False) -> None:
    """A fused-GEMV kernel on its grid: on the GPU with the config pinned for its shape (`jit.pinned`) or autotuned;
    on the CPU interpreter with fixed small blocks and split-K on for long K, so the tests' small shapes take the
    split path too (timing configs there measures nothing). `evict_first`: the weight read with L2's evict-first
    policy. `early`, under PDL: the next kernel launches as this one starts, so its programs wait resident (and
    issue their first weight loads) while this one streams; else after the weight stream, which the GEMVs with a
    RoPE or routing epilogue take: the attention or expert programs resident through the whole projection slow it."""
    flags = {**flags, "BLOCK_M": next_pow2(m), **pdl(args[0]), "EARLY": early, "RSTD_BLOCK": rstd_block(k),
             "EVICT": "evict_first" if evict_first else ""}
    if interpreting():
        split = 3 if k >= 192 else 1
        kernel[(cdiv(n, 16), split)](*args, **flags, BLOCK_N=16, BLOCK_K=64, SPLIT_K=split)
    else:
        from athanor.kernels.jit.pinned import launch_pinned

        def grid(meta: dict[str, int]) -> tuple[int, int]:
            return cdiv(n, meta["BLOCK_N"]), meta["SPLIT_K"]

        if not launch_pinned(kernel, tuned, grid, args, flags):  # a shape pinned for the step, else autotuned
            tuned[grid](*args, **flags)
