"""Random weights for a spec: speed work on large shapes needs the shapes, not the values.

Scales keep activations bounded through many layers (projections ~ N(0, 1/fan_in), norms scaling by 1),
so a random model still produces finite logits in bf16. MoE routing of a random model is
not realistic; replay a measured routing profile (athanor.traffic) on top of it.
"""

from __future__ import annotations

import torch

from athanor.model.model import Model
from athanor.model.spec import ModelSpec, weight_shapes


def random_model(
    spec: ModelSpec,
    seed: int = 0,
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float32,
) -> Model:
    """A `Model` with random weights of `spec`'s shapes, generated directly on `device`."""
    gen = torch.Generator(device=device).manual_seed(seed)
    weights: dict[str, torch.Tensor] = {}
    for name, shape in weight_shapes(spec).items():
        leaf = name.rsplit(".", 1)[-1]
        if leaf.endswith("norm"):  # a scale of one: Gemma's norms scale by (1 + weight)
            t = (torch.zeros if spec.norm_unit_offset else torch.ones)(shape, device=device, dtype=dtype)
        elif leaf in ("bq", "bk", "bv"):
            t = torch.randn(shape, generator=gen, device=device, dtype=dtype) * 0.02
        else:
            fan_in = shape[-1]
            # A tied embedding is also the LM head: N(0, 1) there makes logits ~N(0, hidden), whose
            # bf16 rounding (~hidden**0.5 * 2**-8 absolute) exceeds any logits tolerance everywhere.
            untied_embed = leaf == "embed" and not spec.tie_embeddings
            std = 1.0 if untied_embed else fan_in**-0.5
            t = torch.randn(shape, generator=gen, device=device, dtype=dtype) * std
        weights[name] = t
    return Model(spec, weights, source=f"random:{spec.name}@{seed}")
