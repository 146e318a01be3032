"""How many engine slots fit one GPU next to the compile loop's engines.

A compile (or the tier benchmark) runs two tiers, each with three engine workers on a GPU
(`TierEngines`), each holding the model's weights: the incumbent's with two residents (the incumbent
and its twin), the challenger's with two (the baseline it starts with, the challenger), the
reference's with one. Every resident owns a KV cache for
`max_seqs + 1` slots of `max_seq_len` tokens, and may own copies of layer weights (a fused QKV or
gate/up projection copies them in build()). On one GPU all of it must fit at once: an 8B model at the
GPU default of 64 slots x 4096 tokens needs 35 GiB of KV cache per resident, more than an H200 holds
for six engines. So when the slots are not given, the largest count that fits is taken.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from athanor.errors import ConfigError
from athanor.evaluate.scripts import PREFILL_TOKENS
from athanor.model.spec import ModelSpec, kv_cache_bytes, layer_weight_shapes

GIB = 1 << 30
RESIDENTS = (2, 2, 1)
"""Residents of a tier's engine workers on a GPU: the incumbent's, the challenger's, the reference's."""
COPYING_RESIDENTS = 3
"""Residents per tier that may copy weights: the incumbent, its twin, the challenger (not the baseline)."""
COPYABLE = ("wq", "wk", "wv", "w_gate", "w_up", "shared.w_gate", "shared.w_up", "experts.w_gate", "experts.w_up")
"""Layer weights a candidate may copy in build() (fused QKV and gate/up)."""
PROCESS_OVERHEAD = 2 * GIB
"""Per engine worker: the CUDA context, captured graphs' pools, autotuning buffers."""
USABLE_SHARE = 0.9
"""Of the device's memory; the rest is left for fragmentation and whatever else runs there."""


@dataclass(frozen=True)
class MemoryPlan:
    """Engine slots for one GPU and the bytes they were planned with."""

    max_seqs: int
    fixed_bytes: int
    """Weights (three workers per tier) and the residents' possible weight copies, with per-worker overhead and
    prefill activations."""
    kv_bytes_per_slot: int
    """KV cache of one slot in every resident of both tiers."""
    device_bytes: int

    def describe(self) -> str:
        used = self.fixed_bytes + (self.max_seqs + 1) * self.kv_bytes_per_slot
        return (f"{self.max_seqs} engine slots: {used / GIB:.1f} of {self.device_bytes / GIB:.1f} GiB planned "
                f"({self.fixed_bytes / GIB:.1f} GiB weights, copies and overhead; "
                f"{self.kv_bytes_per_slot / GIB:.2f} GiB of KV cache per slot)")


def plan_engine_slots(spec: ModelSpec, itemsize: int, tier_layers: tuple[int, ...], max_seq_len: int,
                      device_bytes: int, wanted: int) -> MemoryPlan:
    """The most slots (at most `wanted`) whose tiers' engines all fit `device_bytes`; a ConfigError naming
    the flags to change when not even one does."""
    fixed, per_slot = 0, 0
    for layers in tier_layers:
        sub = spec.with_layers(layers)
        copies = layers * sum(math.prod(shape) for name, shape in layer_weight_shapes(sub).items() if name in COPYABLE)
        fixed += (len(RESIDENTS) * (sub.num_params() * itemsize + PROCESS_OVERHEAD + activation_bytes(spec, itemsize))
                  + COPYING_RESIDENTS * copies * itemsize)
        per_slot += sum(RESIDENTS) * kv_cache_bytes(sub, 1, max_seq_len, itemsize)
    budget = int(device_bytes * USABLE_SHARE) - fixed
    slots = min(wanted, budget // per_slot - 1) if budget > 0 else 0
    if slots < 1:
        raise ConfigError(
            f"{spec.name}: the compile loop's engines do not fit this GPU ({device_bytes / GIB:.0f} GiB): "
            f"{fixed / GIB:.0f} GiB of weights, weight copies and overhead before any KV cache, and "
            f"{per_slot / GIB:.2f} GiB of KV cache per slot at --max-seq-len {max_seq_len}; pass a smaller "
            f"--max-seq-len, a lower-precision --dtype, or a smaller model")
    return MemoryPlan(max_seqs=slots, fixed_bytes=fixed, kv_bytes_per_slot=per_slot, device_bytes=device_bytes)


def activation_bytes(spec: ModelSpec, itemsize: int) -> int:
    """A bound on one prefill step's live activations: a script's step carries at most PREFILL_TOKENS tokens,
    each holding about three MLP intermediates (gate, up, their product) and six hidden-sized tensors (the
    residual, norms, attention's q/k/v/out), twice over for the allocator's transient copies."""
    moe = spec.moe
    inter = spec.intermediate_size if moe is None else max(moe.top_k * moe.intermediate_size,
                                                              moe.shared_intermediate_size)
    return PREFILL_TOKENS * (3 * inter + 6 * spec.hidden_size) * itemsize * 2


def device_bytes(device: str) -> int:
    """Total memory of a CUDA device ("cuda" or "cuda:N")."""
    import torch

    return int(torch.cuda.get_device_properties(torch.device(device)).total_memory)
