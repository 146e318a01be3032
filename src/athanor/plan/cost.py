"""The layout cost model: a decode step's and a prompt's time on each rank of a layout, from the bytes it moves,
the FLOPs it does and the collectives it waits on, and what a layout holds in each GPU's memory.

Deliberately simple, and every term visible (`StepCost`): from the specification alone, decode is the larger of its
bytes over the copy bandwidth and its FLOPs over the matrix rate, plus collectives, which are not assumed to overlap;
prefill is its FLOPs at the hardware's prefill efficiency, plus its all-reduces. Measured steps replace the
specification's combination with a fitted one (`DecodeFit`, fitted by `athanor.plan.calibration`): where a record
and this model disagree, the record wins and the plan says by how much. An MoE layer reads the experts its rows
activate: under a measured routing profile as many as the profile's batches did, else as many as uniform routing
would (an upper bound: real routing is skewed and reads fewer).

Layouts (`Layout`): TP splits attention heads and MLP columns (KV heads are replicated when TP exceeds them), EP
places the routed experts across the TP x DP ranks, DCP splits a replicated KV head's tokens across the ranks holding
copies, PP splits the layers into stages (a step passes all of them), DP runs replicas, each with its share of the
concurrent sequences.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from athanor.evaluate.objective import prefill_flops
from athanor.model import Layout, ModelSpec
from athanor.plan.hardware import Hardware

if TYPE_CHECKING:
    from athanor.traffic.routing import RoutingProfile

DTYPE_BYTES = 2
"""bf16 weights and KV: what the plan assumes a GPU serves."""


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def layouts(spec: ModelSpec, gpus: int) -> list[Layout]:
    """Every layout of `gpus` GPUs the model's shapes allow: TP dividing the query heads and the KV heads (or a
    multiple of them), PP dividing the layers, EP (MoE) over all TP x DP ranks where it divides the experts, DCP
    over the replicated copies of a KV head."""
    out = []
    for tp in _divisors(gpus):
        kv_ok = spec.num_kv_heads % tp == 0 or tp % spec.num_kv_heads == 0
        if spec.num_heads % tp or not kv_ok:
            continue
        for pp in _divisors(gpus // tp):
            if spec.num_layers % pp:
                continue
            dp = gpus // (tp * pp)
            copies = max(1, tp // spec.num_kv_heads)
            eps = [1]
            if spec.moe is not None and tp * dp > 1 and spec.moe.num_experts % (tp * dp) == 0:
                eps.append(tp * dp)
            for ep in eps:
                for dcp in _divisors(copies):
                    out.append(Layout(tp=tp, ep=ep, dp=dp, pp=pp, dcp=dcp))
    return out


@dataclass(frozen=True)
class DecodeFit:
    """Measured decode steps as a sum of the modelled terms: seconds of step per second of each term. The weights
    have one coefficient for a single row (matrix-vector kernels near the copy bandwidth) and one for more rows
    (matrix products, which read the same bytes less efficiently and do work that overlaps them only in part);
    `overhead_s` is what a step costs beyond its bytes and FLOPs (launches, norms, sampling)."""

    gemv: float
    gemm: float
    kv: float
    compute: float
    overhead_s: float

    def step_s(self, rows: int, weight_s: float, kv_s: float, compute_s: float, stages: int = 1) -> float:
        return (self.gemv if rows == 1 else self.gemm) * weight_s + self.kv * kv_s + self.compute * compute_s \
            + stages * self.overhead_s


@dataclass(frozen=True)
class StepCost:
    """One decode step of a replica's rows: the seconds of each term on the slowest rank."""

    rows: int
    weight_s: float
    kv_s: float
    compute_s: float
    comm_s: float
    overhead_s: float
    fit: DecodeFit | None = None
    """Measured steps' combination of the terms (None: the specification's)."""
    stages: int = 1

    @property
    def memory_s(self) -> float:
        return self.weight_s + self.kv_s

    @property
    def total_s(self) -> float:
        if self.fit is None:
            return max(self.memory_s, self.compute_s) + self.comm_s + self.overhead_s
        return self.fit.step_s(self.rows, self.weight_s, self.kv_s, self.compute_s, self.stages) + self.comm_s


def _ring(bytes_: float, ranks: int, hw: Hardware) -> float:
    """A ring all-reduce of `bytes_` over `ranks` GPUs (bus bandwidth already counts the ring's factor)."""
    if ranks <= 1:
        return 0.0
    return bytes_ / hw.link_bytes_s + (ranks - 1) * hw.link_latency_s


def _exchange(bytes_: float, ranks: int, hw: Hardware) -> float:
    """An all-to-all or all-gather in which each rank sends the (ranks - 1) / ranks of `bytes_` it does not keep."""
    if ranks <= 1:
        return 0.0
    return bytes_ * (ranks - 1) / ranks / hw.link_bytes_s + (ranks - 1) * hw.link_latency_s


def _kv_heads_per_rank(spec: ModelSpec, tp: int) -> int:
    return max(1, spec.num_kv_heads // tp)


def attention_weight_bytes(spec: ModelSpec, tp: int) -> float:
    """One layer's attention weights on one TP rank (KV projections replicated past the KV heads)."""
    h, d = spec.hidden_size, spec.head_dim
    return h * d * (2 * spec.num_heads / tp + 2 * _kv_heads_per_rank(spec, tp)) * DTYPE_BYTES


def expert_bytes(spec: ModelSpec) -> float:
    assert spec.moe is not None
    return 3 * spec.hidden_size * spec.moe.intermediate_size * DTYPE_BYTES


def touched_experts(spec: ModelSpec, rows: int, routing: RoutingProfile | None = None) -> float:
    """Experts of a layer a step of `rows` tokens reads: as many as `routing`'s batches of that size activated on
    average, else in expectation under uniform routing. Past the profile's largest batch, the count grows as
    independent tokens drawn from its loads would make it, from where the profile leaves off."""
    assert spec.moe is not None
    e, k = spec.moe.num_experts, spec.moe.top_k
    if routing is None:
        return e * (1.0 - (1.0 - k / e) ** rows)
    if rows <= len(routing.distinct):
        return routing.distinct[rows - 1]

    def independent(b: int) -> float:
        return sum(sum(1.0 - (1.0 - min(1.0, k * p)) ** b for p in layer) for layer in routing.load) / len(routing.load)

    last = len(routing.distinct)
    return min(float(e), routing.distinct[-1] + independent(rows) - independent(last))


def mlp_step_bytes(spec: ModelSpec, layout: Layout, rows: int, routing: RoutingProfile | None = None) -> float:
    """One layer's MLP weights one rank reads in a step of `rows` tokens."""
    h = spec.hidden_size
    if spec.moe is None:
        return 3 * h * spec.intermediate_size * DTYPE_BYTES / layout.tp
    shared = 3 * h * spec.moe.shared_intermediate_size * DTYPE_BYTES / layout.tp
    routed = touched_experts(spec, rows * (layout.dp if layout.ep > 1 else 1), routing) * expert_bytes(spec)
    return shared + (routed / layout.ep if layout.ep > 1 else routed / layout.tp)


def mlp_held_bytes(spec: ModelSpec, layout: Layout) -> float:
    """One layer's MLP weights one rank holds."""
    if spec.moe is None:
        return 3 * spec.hidden_size * spec.intermediate_size * DTYPE_BYTES / layout.tp
    shared = 3 * spec.hidden_size * spec.moe.shared_intermediate_size * DTYPE_BYTES / layout.tp
    experts = spec.moe.num_experts * expert_bytes(spec)
    return shared + (experts / layout.ep if layout.ep > 1 else experts / layout.tp)


def kv_bytes_per_token(spec: ModelSpec, layout: Layout) -> float:
    """Keys and values of one token, all of a stage's layers, on one rank."""
    return (2 * spec.head_dim * _kv_heads_per_rank(spec, layout.tp) * DTYPE_BYTES * spec.num_layers
            / layout.pp / layout.dcp)


def held_bytes(spec: ModelSpec, layout: Layout, tokens: int) -> float:
    """What one rank holds: its weights and the KV of `tokens` cached tokens of its replica."""
    layers = spec.num_layers / layout.pp
    vocab = spec.vocab_size * spec.hidden_size * DTYPE_BYTES / layout.tp * (1 if spec.tie_embeddings else 2)
    weights = layers * (attention_weight_bytes(spec, layout.tp) + mlp_held_bytes(spec, layout)) + vocab
    return weights + tokens * kv_bytes_per_token(spec, layout)


def decode_step(spec: ModelSpec, hw: Hardware, layout: Layout, rows: int, context: int, fit: DecodeFit | None = None,
                routing: RoutingProfile | None = None) -> StepCost:
    """A decode step of `rows` sequences of `context` cached tokens on one replica of `layout`. Under PP the rows go
    through the stages as `pp` microbatches, so the step takes `pp` stage times of rows / pp each."""
    micro = max(1, math.ceil(rows / layout.pp))
    layers = spec.num_layers / layout.pp
    h = spec.hidden_size
    head = spec.vocab_size * h * DTYPE_BYTES / layout.tp / layout.pp  # the LM head, on the last stage
    weights = layers * (attention_weight_bytes(spec, layout.tp) + mlp_step_bytes(spec, layout, micro, routing)) + head
    kv = micro * context * kv_bytes_per_token(spec, layout)
    active = spec.active_params_per_token() / layout.tp / layout.pp
    attention_flops = 4 * micro * context * spec.num_heads * spec.head_dim * layers / layout.tp / layout.dcp
    flops = 2 * micro * active + attention_flops
    activation = micro * h * DTYPE_BYTES
    comm = layers * 2 * _ring(activation, layout.tp, hw)
    if layout.ep > 1:  # the MLP's all-reduce becomes a dispatch and a combine of each token's top-k rows
        assert spec.moe is not None
        comm += layers * (2 * _exchange(activation * spec.moe.top_k, layout.ep, hw) - _ring(activation, layout.tp, hw))
    if layout.dcp > 1:  # partial attention outputs and their log-sum-exps, gathered across the KV's shards
        comm += layers * _exchange(micro * spec.num_heads / layout.tp * (spec.head_dim + 1) * 4, layout.dcp, hw)
    pp = layout.pp
    send = _exchange(activation * 2, 2, hw) if pp > 1 else 0.0  # to the next stage
    return StepCost(micro, pp * weights / hw.hbm_bytes_s, pp * kv / hw.hbm_bytes_s, pp * flops / hw.matmul_flops,
                    pp * (comm + send), pp * hw.step_overhead_s, fit, pp)


def prefill_s(spec: ModelSpec, hw: Hardware, layout: Layout, tokens: int) -> float:
    """One prompt of `tokens` alone on one replica (chunks pipelined through PP's stages)."""
    flops = prefill_flops(spec, spec.num_layers, tokens, 0)
    compute = flops / (layout.tp * layout.pp * hw.matmul_flops * hw.prefill_efficiency)
    comm = spec.num_layers / layout.pp * 2 * _ring(tokens * spec.hidden_size * DTYPE_BYTES, layout.tp, hw)
    return compute + comm
