"""Tensor parallelism: one rank's share of a model, Megatron-style.

Each of `tp` ranks holds a contiguous block of the query heads and the KV heads they read (a KV head is repeated
on every rank whose query heads use it when there are fewer KV heads than ranks), and a block of every MLP's (and
expert's) intermediate columns. Where the KV heads or the columns do not divide by `tp` but there are at least as
many KV heads as ranks, the blocks are as even as whole KV groups and columns allow (3 KV heads over 2 ranks: one
and two), so a model's shapes need not be multiples of the layout's degree; the ranks' specs then differ. The projections back to the hidden size (attention's output, the MLP's down
projection) are split by rows, so each rank's result is a partial sum: the forward adds them across ranks
(`BuildContext.all_reduce`) and every rank then holds the same hidden states. Norms, the router, embeddings and the
LM head are whole on every rank, so each rank's logits are the whole model's.

The rank's `ModelSpec` is the model's with its head and column counts divided: a forward written for one device
runs unchanged on a shard, but for the two all-reduces per layer.
"""

from __future__ import annotations

import dataclasses

from torch import Tensor

from athanor.errors import ConfigError
from athanor.model.model import Model
from athanor.model.spec import ModelSpec


def _block(width: int, ranks: int, rank: int) -> slice:
    """Rank `rank`'s contiguous block of `width` units split as evenly as possible over `ranks`."""
    return slice(rank * width // ranks, (rank + 1) * width // ranks)


def _uneven(spec: ModelSpec, tp: int) -> bool:
    """Whether `tp` ranks split this model's heads and columns in blocks of whole KV groups that need not be equal."""
    return tp > 1 and spec.num_kv_heads >= tp and bool(spec.num_kv_heads % tp or spec.num_heads % tp)


def shard_spec(spec: ModelSpec, tp: int, ep: int = 1, rank: int = 0) -> ModelSpec:
    """The spec of rank `rank`'s shard under `tp`-way tensor parallelism and, for a MoE, `ep`-way expert parallelism
    (each rank whole experts, a block of them; the router still scores all); a ConfigError naming the shape that
    does not divide."""
    moe = spec.moe
    dense = moe is None or bool(spec.dense_layers)  # some layer has a dense MLP, `intermediate_size` wide
    uneven = _uneven(spec, tp)
    widths = [] if uneven else [("num_attention_heads", spec.num_heads, tp)]
    if dense and not uneven:
        widths.append(("intermediate_size", spec.intermediate_size, tp))
    if moe is not None:
        widths.append(("num_experts", moe.num_experts, ep) if ep > 1 else
                      ("moe_intermediate_size", moe.intermediate_size, tp))
        if moe.shared_intermediate_size:
            widths.append(("shared_expert_intermediate_size", moe.shared_intermediate_size, tp))
    for name, width, ranks in widths:
        if width % ranks:
            raise ConfigError(f"{spec.name}: {name} {width} does not divide over {ranks} ranks")
    if spec.num_kv_heads % tp and tp % spec.num_kv_heads and not uneven:
        raise ConfigError(f"{spec.name}: {spec.num_kv_heads} KV heads neither divide over tp={tp} ranks nor "
                          "repeat evenly on them")
    shard_moe = moe and dataclasses.replace(moe, intermediate_size=moe.intermediate_size // (1 if ep > 1 else tp),
                                            shared_intermediate_size=moe.shared_intermediate_size // tp)
    if uneven:
        kv = _block(spec.num_kv_heads, tp, rank % tp)
        group = spec.num_heads // spec.num_kv_heads
        inner = _block(spec.intermediate_size, tp, rank % tp)
        return dataclasses.replace(spec, num_heads=(kv.stop - kv.start) * group, num_kv_heads=kv.stop - kv.start,
                                   intermediate_size=inner.stop - inner.start if dense else spec.intermediate_size,
                                   moe=shard_moe)
    return dataclasses.replace(spec, num_heads=spec.num_heads // tp, num_kv_heads=max(1, spec.num_kv_heads // tp),
                               intermediate_size=spec.intermediate_size // tp if dense else spec.intermediate_size,
                               moe=shard_moe)


def shard_model(model: Model, rank: int, tp: int = 1, ep: int = 1) -> Model:
    """Rank `rank`'s share of `model` under `tp`-way TP and `ep`-way EP (views of its weights: nothing is copied).
    Ranks beyond a degree repeat its shards (rank % tp, rank % ep): EP over TP ranks, or replicated attention."""
    if tp == 1 and ep == 1:
        return model
    mine, cut = shard_cuts(model.spec, rank, tp, ep)
    weights: dict[str, Tensor] = {}
    for name, t in model.weights.items():
        part = cut.get(name.split(".", 2)[2] if name.startswith("layers.") else name)
        weights[name] = t if part is None else t.narrow(part[0], part[1].start, part[1].stop - part[1].start)
    return Model(mine, weights, f"{model.source} (shard of tp={tp} ep={ep})", model.full_num_layers)


def shard_cuts(spec: ModelSpec, rank: int, tp: int, ep: int) -> tuple[ModelSpec, dict[str, tuple[int, slice]]]:
    """Rank `rank`'s spec, and the part of each weight it holds: by canonical name (without `layers.{i}.`), the
    dimension cut and the slice of it kept; a name not listed is whole on every rank."""
    mine = shard_spec(spec, tp, ep, rank)
    experts = slice(0)
    if ep > 1 and spec.moe is not None:
        held = spec.moe.num_experts // ep
        experts = slice((rank % ep) * held, (rank % ep + 1) * held)
    rank %= tp
    d = spec.head_dim
    uneven = _uneven(spec, tp)
    group = spec.num_heads // spec.num_kv_heads
    # this rank's first query head, and the KV head it reads
    q0 = _block(spec.num_kv_heads, tp, rank).start * group if uneven else rank * mine.num_heads
    kv0 = q0 // group
    q_rows = slice(q0 * d, (q0 + mine.num_heads) * d)
    kv_rows = slice(kv0 * d, (kv0 + mine.num_kv_heads) * d)

    def columns(width: int) -> slice:
        return slice(rank * width, (rank + 1) * width)

    dense_inner = _block(spec.intermediate_size, tp, rank) if uneven else columns(mine.intermediate_size)
    inner = columns(mine.moe.intermediate_size) if mine.moe else dense_inner
    shared = columns(mine.moe.shared_intermediate_size) if mine.moe else slice(0)
    heads = slice(q0, q0 + mine.num_heads)
    cut: dict[str, tuple[int, slice]] = {
        "wq": (0, q_rows), "bq": (0, q_rows), "wk": (0, kv_rows), "bk": (0, kv_rows), "wv": (0, kv_rows),
        "bv": (0, kv_rows), "wo": (1, q_rows), "w_gate": (0, dense_inner), "w_up": (0, dense_inner),
        "w_down": (1, dense_inner), "shared.w_gate": (0, shared), "shared.w_up": (0, shared),
        "shared.w_down": (1, shared), "sinks": (0, heads),
    } if tp > 1 else {}
    if tp > 1 and spec.mla:  # the latents are whole on every rank; their expansion and the query split by heads
        per_head = spec.mla.nope_dim + spec.mla.v_dim
        cut.update({"q_b": (0, q_rows), "kv_b": (0, slice(q0 * per_head, (q0 + mine.num_heads) * per_head)),
                    "wo": (1, slice(q0 * spec.mla.v_dim, (q0 + mine.num_heads) * spec.mla.v_dim))})
    if ep > 1:  # whole experts, a block of them
        cut.update({f"experts.{w}": (0, experts) for w in ("w_gate", "w_up", "w_down", "b_gate", "b_up", "b_down")})
    elif tp > 1:  # a block of every expert's columns; each rank adds the down projection's bias, divided
        cut.update({"experts.w_gate": (1, inner), "experts.w_up": (1, inner), "experts.w_down": (2, inner),
                    "experts.b_gate": (1, inner), "experts.b_up": (1, inner)})
    return mine, cut
