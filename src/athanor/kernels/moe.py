"""Mixture-of-experts pieces: routing, grouping (token, k) pairs by expert, and the expert MLPs.

Three ways to run the routed experts (`moe_experts(..., backend=)`):
- "loop": the reference's loop over the experts a batch uses. Data-dependent shapes and a host
  sync per layer, so not CUDA-graph safe.
- "grouped_mm": pairs sorted by expert, then `torch._grouped_mm` with per-expert offsets (where the
  installed torch has it): static shapes, graph safe.
- "triton": the block-aligned grouping of `group_by_expert` and `jit/moe.py`'s expert GEMM: static
  shapes, graph safe, each expert's weights read once per BLOCK_M pairs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from athanor.errors import ConfigError
from athanor.kernels.activation import silu_mul
from athanor.kernels.dispatch import Impl, cdiv, interpreting, next_pow2, pdl, rstd_block, tickets, use_triton
from athanor.kernels.norm import rms_norm_torch

BACKENDS = ("loop", "grouped_mm", "triton")


def has_grouped_mm() -> bool:
    """Whether this torch build has `torch._grouped_mm` (2.8+; its CUDA path wants bf16 on sm90+)."""
    return hasattr(torch, "_grouped_mm")


# -- routing ---------------------------------------------------------------------------------------
def route_torch(router_logits: Tensor, top_k: int, scoring: str, renormalize: bool,
                selection_bias: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """The reference's routing: top-k ids [N, k] int64 and weights [N, k] fp32."""
    logits = router_logits.float()
    scores = torch.softmax(logits, dim=-1) if scoring == "softmax" else torch.sigmoid(logits)
    chooser = scores if selection_bias is None else scores + selection_bias.float()
    ids = torch.topk(chooser, top_k, dim=-1).indices
    weights = scores.gather(1, ids)
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return ids, weights


def route(router_logits: Tensor, top_k: int, scoring: str, renormalize: bool,
          selection_bias: Tensor | None = None, impl: Impl = None) -> tuple[Tensor, Tensor]:
    """Softmax or sigmoid scores, top-k by (score + selection_bias), optional renormalisation, in one kernel.

    router_logits: [N, E]; selection_bias: [E] or None. Returns ids [N, k] int64, weights [N, k] fp32.
    """
    if scoring not in ("softmax", "sigmoid"):
        raise ConfigError(f"routing scoring must be softmax or sigmoid, not {scoring!r}")
    if not use_triton(router_logits, impl):
        return route_torch(router_logits, top_k, scoring, renormalize, selection_bias)
    from athanor.kernels.jit.moe import route_kernel

    n, e = router_logits.shape
    logits = router_logits if router_logits.stride(1) == 1 else router_logits.contiguous()
    ids = torch.empty((n, top_k), dtype=torch.long, device=logits.device)
    weights = torch.empty((n, top_k), dtype=torch.float32, device=logits.device)
    if n:
        route_kernel[(n,)](
            logits, selection_bias if selection_bias is not None else logits, ids, weights, logits.stride(0), e,
            TOP_K=top_k, SOFTMAX=scoring == "softmax", RENORM=renormalize, HAS_BIAS=selection_bias is not None,
            BLOCK_E=next_pow2(e), CHUNK=min(32, next_pow2(e)), **pdl(logits),
        )
    return ids, weights


# -- grouping ----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ExpertGroups:
    """(token, k) pairs grouped by expert; pair p is token p // top_k's k-th choice. All on the device.

    order:         [N*k] int64  pair indices sorted by expert (stable)
    offsets:       [E] int32    end of each expert's run in `order` (inclusive cumsum of counts)
    sorted_pairs:  [P] int32    `order` with each expert's run padded to a multiple of block_m with N*k
    block_experts: [P / block_m] int32  the expert of each block
    num_padded:    [1] int32    blocks * block_m actually used (<= P)
    """

    order: Tensor
    offsets: Tensor
    sorted_pairs: Tensor
    block_experts: Tensor
    num_padded: Tensor
    block_m: int


def group_by_expert(topk_ids: Tensor, num_experts: int, block_m: int = 16) -> ExpertGroups:
    """Sort the pairs of `topk_ids` [N, k] by expert and align each expert's run to `block_m`.

    Plain torch ops with static output shapes and no host sync (scatter_add, not bincount, which
    syncs to size its output), so it can be captured in a CUDA graph.
    """
    flat = topk_ids.flatten()
    num_pairs = flat.numel()
    device = flat.device
    counts = torch.zeros(num_experts, dtype=torch.int64, device=device)
    counts.scatter_add_(0, flat, torch.ones_like(flat))
    order = torch.sort(flat, stable=True).indices
    ends = torch.cumsum(counts, 0)
    starts = ends - counts
    padded = (counts + block_m - 1) // block_m * block_m
    padded_ends = torch.cumsum(padded, 0)
    padded_starts = padded_ends - padded
    # At most min(num_pairs, E) experts are used, each wasting < block_m rows.
    capacity = cdiv(num_pairs + min(num_pairs, num_experts) * (block_m - 1), block_m) * block_m
    expert_of_sorted = flat[order]
    rank = torch.arange(num_pairs, device=device) - starts[expert_of_sorted]
    dest = padded_starts[expert_of_sorted] + rank
    sorted_pairs = torch.full((capacity,), num_pairs, dtype=torch.int32, device=device)
    sorted_pairs.scatter_(0, dest, order.to(torch.int32))
    block_starts = torch.arange(0, capacity, block_m, device=device)
    block_experts = torch.searchsorted(padded_ends, block_starts, right=True).clamp_(max=num_experts - 1)
    return ExpertGroups(order=order, offsets=ends.to(torch.int32), sorted_pairs=sorted_pairs,
                        block_experts=block_experts.to(torch.int32), num_padded=padded_ends[-1:].to(torch.int32),
                        block_m=block_m)


# -- expert GEMMs ----------------------------------------------------------------------------------
def grouped_mm(a: Tensor, w: Tensor, offsets: Tensor) -> Tensor:
    """Rows of `a` [P, K], sorted by expert, times their expert's `w` [E, N, K]^T. Returns [P, N].

    offsets: [E] int32 end of each expert's rows. `torch._grouped_mm` where torch has it, else a loop.
    """
    if has_grouped_mm():
        return torch._grouped_mm(a, w.transpose(-2, -1), offs=offsets)
    out = a.new_empty((a.shape[0], w.shape[1]))
    start = 0
    for e, end in enumerate(offsets.tolist()):
        out[start:end] = a[start:end] @ w[e].T
        start = end
    return out


def _moe_gemm(a: Tensor, w: Tensor, groups: ExpertGroups, num_pairs: int, rows_per_a: int,
              pair_weights: Tensor | None) -> Tensor:
    from athanor.kernels.jit.moe import moe_gemm_kernel

    n_out, k = w.shape[1], w.shape[2]
    assert a.stride(1) == 1 and w.stride(2) == 1
    out = torch.empty((num_pairs, n_out), dtype=a.dtype, device=a.device)
    block_n, block_k = 64, 64
    grid = (groups.block_experts.numel(), cdiv(n_out, block_n))
    moe_gemm_kernel[grid](
        a, w, out, groups.sorted_pairs, groups.block_experts, groups.num_padded,
        pair_weights if pair_weights is not None else out,
        num_pairs, n_out, k, a.stride(0), w.stride(0), w.stride(1), out.stride(0),
        ROWS_PER_A=rows_per_a, MUL_WEIGHTS=pair_weights is not None,
        BLOCK_M=groups.block_m, BLOCK_N=block_n, BLOCK_K=block_k,
    )
    return out


def moe_experts(x: Tensor, w_gate_up: Tensor | tuple[Tensor, Tensor], w_down: Tensor, topk_ids: Tensor,
                topk_weights: Tensor, backend: str = "triton") -> Tensor:
    """Sum over each token's top-k experts of weight * SwiGLU expert(x). Returns [N, H] in x's dtype.

    x: [N, H]; w_gate_up: [E, 2I, H] (gate rows then up rows, concatenated in build()) or the pair
    (w_gate [E, I, H], w_up [E, I, H]); w_down: [E, H, I]; topk_ids: [N, k] int64; topk_weights: [N, k] fp32.
    """
    n, k = topk_ids.shape
    num_experts = w_down.shape[0]

    def gate_up(gemm: Callable[[Tensor], Tensor]) -> Tensor:
        # the SwiGLU activation [rows, I] of whatever rows `gemm` multiplies with a weight [.., N, K]
        if isinstance(w_gate_up, Tensor):
            h = gemm(w_gate_up)
            width = h.shape[1] // 2
            return silu_mul(h[:, :width], h[:, width:], impl=None if backend != "loop" else "torch")
        return silu_mul(gemm(w_gate_up[0]), gemm(w_gate_up[1]), impl=None if backend != "loop" else "torch")

    if backend == "loop" or (backend == "triton" and not use_triton(x)):
        out = torch.zeros_like(x)
        for e in torch.unique(topk_ids).tolist():
            token_idx, k_idx = torch.nonzero(topk_ids == e, as_tuple=True)
            rows = x[token_idx]

            def expert_gemm(w: Tensor, rows: Tensor = rows, e: int = e) -> Tensor:
                return F.linear(rows, w[e])

            y = F.linear(gate_up(expert_gemm), w_down[e])
            out.index_add_(0, token_idx, y * topk_weights[token_idx, k_idx, None].to(x.dtype))
        return out
    if backend == "grouped_mm":
        groups = group_by_expert(topk_ids, num_experts, block_m=1)
        xs = x.index_select(0, groups.order // k)  # [N*k, H] rows sorted by expert
        act = gate_up(lambda w: grouped_mm(xs, w, groups.offsets))  # [N*k, I]
        y = grouped_mm(act, w_down, groups.offsets)  # [N*k, H]
        y = y * topk_weights.flatten()[groups.order, None].to(x.dtype)
        unsorted = torch.empty_like(y)
        unsorted[groups.order] = y
        return unsorted.view(n, k, -1).sum(1)
    if backend != "triton":
        raise ConfigError(f"moe backend must be one of {', '.join(BACKENDS)}, not {backend!r}")
    groups = group_by_expert(topk_ids, num_experts, block_m=16)
    xc = x.contiguous()
    act = gate_up(lambda w: _moe_gemm(xc, w, groups, n * k, k, None))  # [N*k, I]
    y = _moe_gemm(act, w_down, groups, n * k, 1, topk_weights.flatten().contiguous())  # [N*k, H]
    return y.view(n, k, -1).sum(1)


# -- a few tokens: no grouping -----------------------------------------------------------------------
MAX_EXPERT_GEMV_TOKENS = 8
"""Most tokens `expert_gemv` takes in Triton: each (token, choice) pair streams its expert's weights
on its own, so beyond a few tokens grouping pairs by expert (`moe_experts`) reads less."""


@dataclass(frozen=True)
class RouterLogits:
    """Routing left to the expert kernels: the router's logits [T, E] and how `route` turns them into top-k ids
    and weights. Given to `expert_gemv` in place of ids (and of weights), every program ranks its token's logits
    itself and takes its own choice: routing then costs no launch of its own (`route_choice`)."""

    logits: Tensor
    top_k: int
    scoring: str
    renormalize: bool
    selection_bias: Tensor | None = None

    def route(self, impl: Impl = None) -> tuple[Tensor, Tensor]:
        """The ids [T, k] and weights [T, k] these logits route to (`route`)."""
        return route(self.logits, self.top_k, self.scoring, self.renormalize, self.selection_bias, impl=impl)


INTERPRETED: dict[str, int] = {"BLOCK_N": 16, "BLOCK_K": 32, "PREFETCH": 0}
"""`expert_gemv_kernel`'s config on the CPU interpreter (a GPU autotunes or pins one); tests switch PREFETCH."""


def expert_gemv(x: Tensor, w: Tensor, topk_ids: Tensor | RouterLogits, *, w2: Tensor | None = None,
                up: Tensor | None = None, norm_weight: Tensor | None = None, eps: float = 0.0,
                topk_weights: Tensor | RouterLogits | None = None, residual: Tensor | None = None,
                settled: bool = False, evict_first: bool = False, impl: Impl = None) -> Tensor:
    """The routed experts of a few decode tokens, with no grouping and no host sync: every (token,
    choice) pair multiplies its input row by its expert's weight, read by id on the device.

    topk_ids: [T, k] int64, or the `RouterLogits` they come from (then topk_weights, if given, is the same
    object: the weights come from the logits too). x: [T, K] (each token's input, shared by its k experts) or
    [T*k, K] (one row per pair, e.g. the gate half of the previous call's output, with `up` its up half: then
    the input is silu(x) * up, rounded like `silu_mul`); with `norm_weight`, the token's input is
    rms_norm(x, norm_weight, eps) (x is the residual stream), normed inside the kernel. w: [E, N, K]; w2:
    [E, N2, K] (its outputs follow w's: gate and up in one launch). Returns [T*k, N + N2] (row t*k + j: token
    t's j-th expert), or with topk_weights [T, k] (fp32): [T, N], sum_j topk_weights[t, j] * row (in fp32,
    rounded once), plus `residual` [T, N] if given.

    `settled` (a PDL schedule hint; no effect without PDL): topk_ids and topk_weights were written before
    the launch just before this one, and that launch is an `expert_gemv` (the gate/up call before the
    down call): the kernel then reads the ids and its first weight tile before waiting for that launch.
    `evict_first` (a hint; no value changes): the weights are read with L2's evict-first policy (each is read once a
    step), so they give way first to what else the step reads.
    """
    if isinstance(topk_ids, RouterLogits):
        router, t, k = topk_ids, topk_ids.logits.shape[0], topk_ids.top_k
        assert topk_weights is None or topk_weights is router, "the weights come from the same logits"
    else:
        router, (t, k) = None, topk_ids.shape
    shared = x.shape[0] == t and up is None
    assert norm_weight is None or shared, "the norm prologue is for the token's shared input"
    if t > MAX_EXPERT_GEMV_TOKENS or not use_triton(x, impl):
        if router is not None:
            topk_ids, routed = router.route(impl="torch")
            topk_weights = routed if topk_weights is not None else None
        assert isinstance(topk_ids, Tensor) and not isinstance(topk_weights, RouterLogits)
        if norm_weight is not None:
            x = rms_norm_torch(x, norm_weight, eps)
        rows = x.repeat_interleave(k, 0) if shared else x
        if up is not None:
            rows = F.silu(rows) * up
        ids = topk_ids.flatten()
        y = torch.bmm(w[ids], rows[:, :, None])[:, :, 0]  # [T*k, N]: each pair's expert
        if w2 is not None:
            y = torch.cat([y, torch.bmm(w2[ids], rows[:, :, None])[:, :, 0]], dim=1)
        if topk_weights is None:
            return y
        out = (y.float() * topk_weights.reshape(-1, 1)).view(t, k, -1).sum(1).to(x.dtype)
        return out if residual is None else out + residual
    from athanor.kernels.jit.expert_gemv import expert_gemv_kernel, expert_gemv_tuned

    n, kk = w.shape[1], w.shape[2]
    n2 = w2.shape[1] if w2 is not None else 0
    second = w2 if w2 is not None else w  # a stand-in pointer when there is no second weight (n2 = 0)
    assert w.stride(2) == 1 and x.stride(1) == 1 and (w2 is None or w2.stride(2) == 1)
    assert up is None or up.stride() == x.stride(), "gate and up rows share a stride (halves of one output)"
    if router is not None:
        if router.scoring not in ("softmax", "sigmoid"):
            raise ConfigError(f"routing scoring must be softmax or sigmoid, not {router.scoring!r}")
        ids = router.logits if router.logits.stride(1) == 1 else router.logits.contiguous()
        num_experts = ids.shape[1]
        bias = router.selection_bias
    else:
        assert isinstance(topk_ids, Tensor)
        ids, num_experts, bias = topk_ids.contiguous(), 0, None
    if topk_weights is not None:
        y = torch.empty((t, n), dtype=x.dtype, device=x.device)
        workspace = torch.empty(t * k * (n + 64), dtype=torch.float32, device=x.device)
    else:
        y = torch.empty((t * k, n + n2), dtype=x.dtype, device=x.device)
        workspace = y
    weights = topk_weights.contiguous() if isinstance(topk_weights, Tensor) else y
    args = (x, up if up is not None else x, w, second, ids, weights,
            norm_weight if norm_weight is not None else x, residual if residual is not None else y,
            y, workspace, tickets(x.device), bias if bias is not None else y, n, n2, kk, num_experts, eps,
            x.stride(0), w.stride(0), w.stride(1), second.stride(0), second.stride(1),
            residual.stride(0) if residual is not None else 0, y.stride(0), ids.stride(0))
    flags = {"SHARED": shared, "NORM": norm_weight is not None, "SILU": up is not None, "SUM": topk_weights is not None,
             "RESIDUAL": residual is not None, "TOP_K": k, "SETTLED": settled, "ROUTE": router is not None,
             "SOFTMAX": router is not None and router.scoring == "softmax",
             "RENORM": router is not None and router.renormalize, "HAS_BIAS": bias is not None,
             "BLOCK_E": next_pow2(max(num_experts, 1)), "CHUNK": min(32, next_pow2(max(num_experts, 1))),
             "RSTD_BLOCK": rstd_block(kk), "EVICT": "evict_first" if evict_first else "", **pdl(x)}
    if interpreting():
        block = INTERPRETED["BLOCK_N"]
        grid = (cdiv(n, block) + cdiv(n2, block), t * k)
        expert_gemv_kernel[grid](*args, **flags, **INTERPRETED)
    else:
        from athanor.kernels.jit.pinned import launch_pinned

        def programs(meta: dict[str, int]) -> tuple[int, int]:
            return cdiv(n, meta["BLOCK_N"]) + cdiv(n2, meta["BLOCK_N"]), t * k

        if not launch_pinned(expert_gemv_kernel, expert_gemv_tuned, programs, args, flags):
            expert_gemv_tuned[programs](*args, **flags)
    return y


def routed_experts(h: Tensor, w: Tensor, w2: Tensor | None, w_down: Tensor, topk_ids: Tensor | RouterLogits,
                   topk_weights: Tensor | RouterLogits, norm_weight: Tensor, eps: float, impl: Impl = None,
                   evict_first: bool = False) -> Tensor:
    """h + the routed experts' MLP of a few decode tokens (their ids and weights given) in two `expert_gemv` calls:
    gate and up of rms_norm(h, norm_weight) in one (w: [E, 2 * NI, H] both, or the gate with w2 the up), then the
    down projections weighted, summed and added to h in the other (`settled`: it reads the ids before its wait).
    `evict_first`: both read their weights evict-first from L2 (see `expert_gemv`)."""
    gate_up = expert_gemv(h, w, topk_ids, w2=w2, norm_weight=norm_weight, eps=eps, evict_first=evict_first, impl=impl)
    width = gate_up.shape[1] // 2
    return expert_gemv(gate_up[:, :width], w_down, topk_ids, up=gate_up[:, width:], topk_weights=topk_weights,
                       residual=h, settled=True, evict_first=evict_first, impl=impl)
