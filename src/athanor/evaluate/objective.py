"""The objective: projected GPU-seconds per 1,000 requests, from a `Workload` priced by measured steps.

A workload has tens of (batch, context) decode shapes and (chunk, context) prefill shapes;
timing each would take minutes. The evaluator times a few representative shapes (the ones
that carry most of the workload's estimated cost, clipped to what the engine holds) and prices
every workload step by the measured time of its nearest timed shape, scaled by the ratio of a
roofline estimate (bytes for decode, flops for prefill) of the two. The fast tier times a model
cut to n layers; its times are projected to the whole model as LM head + layers x per-layer
cost, split in proportion to the bytes each part must move (decode is memory-bound).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from athanor.model import ModelSpec
from athanor.traffic import Workload


@dataclass(frozen=True)
class StepShape:
    """One timed shape: `batch_size` rows of `tokens` new tokens on `context_len` cached ones."""

    kind: str
    batch_size: int
    tokens: int
    context_len: int


def _elt(dtype_bytes: int) -> int:
    return max(1, dtype_bytes)


def layer_weight_bytes(spec: ModelSpec, dtype_bytes: int) -> int:
    h, d = spec.hidden_size, spec.head_dim
    attn = h * d * (2 * spec.num_heads + 2 * spec.num_kv_heads)
    if spec.moe is not None:
        # Decode touches top_k experts per token; a batch touches more, so this is a lower bound.
        mlp = 3 * h * spec.moe.intermediate_size * spec.moe.top_k + 3 * h * spec.moe.shared_intermediate_size
    else:
        mlp = 3 * h * spec.intermediate_size
    return (attn + mlp + 2 * h) * _elt(dtype_bytes)


def head_bytes(spec: ModelSpec, dtype_bytes: int) -> int:
    return (spec.vocab_size * spec.hidden_size + spec.hidden_size) * _elt(dtype_bytes)


def kv_bytes_per_token(spec: ModelSpec, num_layers: int, dtype_bytes: int) -> int:
    return 2 * num_layers * spec.num_kv_heads * spec.head_dim * _elt(dtype_bytes)


def decode_bytes(spec: ModelSpec, num_layers: int, batch_size: int, context_len: int, dtype_bytes: int) -> float:
    """Bytes a decode step must move at least: every weight once, and the batch's cached keys and values."""
    weights = head_bytes(spec, dtype_bytes) + num_layers * layer_weight_bytes(spec, dtype_bytes)
    return float(weights + batch_size * context_len * kv_bytes_per_token(spec, num_layers, dtype_bytes))


def prefill_flops(spec: ModelSpec, num_layers: int, tokens: int, context_len: int) -> float:
    h = spec.hidden_size
    per_token = 2 * num_layers * layer_weight_bytes(spec, 1) + 2 * spec.vocab_size * h / max(tokens, 1)
    attn = 4 * num_layers * spec.num_heads * spec.head_dim * (context_len + tokens / 2)
    return float(tokens * (per_token + attn))


def step_cost(spec: ModelSpec, num_layers: int, shape: StepShape, dtype_bytes: int) -> float:
    """The roofline estimate used to scale a measured time to a nearby shape (arbitrary units)."""
    if shape.kind == "decode":
        return decode_bytes(spec, num_layers, shape.batch_size, shape.context_len, dtype_bytes)
    return prefill_flops(spec, num_layers, shape.tokens * shape.batch_size, shape.context_len)


def projection_factor(spec: ModelSpec, num_layers: int, full_layers: int, shape: StepShape, dtype_bytes: int) -> float:
    """Full-model time / n-layer time for `shape`: head + layers x per-layer, split by the roofline estimate."""
    return step_cost(spec, full_layers, shape, dtype_bytes) / step_cost(spec, num_layers, shape, dtype_bytes)


def workload_steps(workload: Workload) -> list[tuple[StepShape, float]]:
    """Every step of the workload as (shape, count per `per_requests` requests)."""
    out = [(StepShape("decode", d.batch_size, 1, d.context_len), d.count) for d in workload.decode]
    out += [(StepShape("prefill", 1, p.chunk_len, p.context_len), p.count) for p in workload.prefill]
    return out


def clip(shape: StepShape, max_seqs: int, max_seq_len: int, decode_steps: int) -> StepShape:
    """The shape the engine can run: batch within its slots, context leaving room for the steps."""
    if shape.kind == "decode":
        return StepShape("decode", min(shape.batch_size, max_seqs), 1,
                         max(1, min(shape.context_len, max_seq_len - decode_steps - 1)))
    tokens = max(2, min(shape.tokens, max_seq_len // 2))
    return StepShape("prefill", 1, tokens, min(shape.context_len, max_seq_len - tokens))


def _distance(a: StepShape, b: StepShape) -> float:
    if a.kind != b.kind:
        return math.inf
    return (abs(math.log2(a.batch_size) - math.log2(b.batch_size)) + abs(math.log2(a.tokens) - math.log2(b.tokens))
            + 0.5 * abs(math.log2(a.context_len + 1) - math.log2(b.context_len + 1)))


def choose_shapes(workload: Workload, spec: ModelSpec, max_seqs: int, max_seq_len: int, decode_steps: int,
                  dtype_bytes: int, max_decode: int = 2, max_prefill: int = 1) -> list[StepShape]:
    """The clipped shapes carrying most of the workload's estimated cost (decode first)."""
    cost: dict[StepShape, float] = {}
    for shape, count in workload_steps(workload):
        c = clip(shape, max_seqs, max_seq_len, decode_steps)
        cost[c] = cost.get(c, 0.0) + count * step_cost(spec, spec.num_layers, shape, dtype_bytes)
    ranked = sorted(cost, key=lambda s: -cost[s])
    decode = [s for s in ranked if s.kind == "decode"][:max_decode]
    prefill = [s for s in ranked if s.kind == "prefill"][:max_prefill]
    return decode + prefill


def price(workload: Workload, spec: ModelSpec, timed: dict[StepShape, float], full_layers: int, dtype_bytes: int
          ) -> tuple[float, dict[StepShape, float]]:
    """(projected seconds per `per_requests` requests, the share of it each timed shape prices).

    `timed` holds whole-model seconds per timed shape; each workload step takes its nearest
    timed shape's time scaled by the roofline ratio of the two.
    """
    total = 0.0
    share = dict.fromkeys(timed, 0.0)
    for shape, count in workload_steps(workload):
        near = min(timed, key=lambda s: _distance(s, shape), default=None)
        if near is None or _distance(near, shape) == math.inf:
            continue
        scale = step_cost(spec, full_layers, shape, dtype_bytes) / step_cost(spec, full_layers, near, dtype_bytes)
        seconds = count * timed[near] * scale
        total += seconds
        share[near] += seconds
    return total, share
