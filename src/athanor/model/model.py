"""`Model`: a spec plus read-only weights under canonical names (see `spec.weight_shapes`).

Weights live on one device in one dtype. Candidates read them and may build transformed
copies (fused QKV, re-layouts) in `build()`; they must not write to these tensors (the
evaluator hashes them before and after).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

import torch
from torch import Tensor

from athanor.errors import ModelLoadError
from athanor.model.spec import ModelSpec, weight_shapes


@dataclass
class Model:
    spec: ModelSpec
    weights: dict[str, Tensor]
    source: str = ""
    """Where the weights came from (a path, `gguf:...`, `random:preset@seed`), for records."""
    full_num_layers: int = field(default=-1)
    """Layer count of the model this one was sliced from (== spec.num_layers when not sliced)."""

    def __post_init__(self) -> None:
        if self.full_num_layers < 0:
            self.full_num_layers = self.spec.num_layers

    # -- access -------------------------------------------------------------------------
    def get(self, name: str) -> Tensor:
        """The weight called `name`; `lm_head` falls back to `embed` for tied embeddings."""
        if name == "lm_head" and self.spec.tie_embeddings:
            return self.weights["embed"]
        return self.weights[name]

    def layer(self, i: int, name: str) -> Tensor:
        return self.weights[f"layers.{i}.{name}"]

    def has(self, name: str) -> bool:
        return name in self.weights

    @property
    def device(self) -> torch.device:
        return self.weights["embed"].device

    @property
    def dtype(self) -> torch.dtype:
        return self.weights["embed"].dtype

    @property
    def num_layers(self) -> int:
        return self.spec.num_layers

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.weights.values())

    def __iter__(self) -> Iterator[tuple[str, Tensor]]:
        return iter(self.weights.items())

    # -- derived models -------------------------------------------------------------------
    def slice(self, num_layers: int) -> Model:
        """The same model cut to its first `num_layers` layers (the fast tier). Shares storage."""
        if not 1 <= num_layers <= self.spec.num_layers:
            raise ValueError(f"slice({num_layers}): the model has {self.spec.num_layers} layers")
        keep = {
            name: t
            for name, t in self.weights.items()
            if not name.startswith("layers.") or int(name.split(".")[1]) < num_layers
        }
        return Model(self.spec.with_layers(num_layers), keep, self.source, self.full_num_layers)

    def to(self, device: torch.device | str | None = None, dtype: torch.dtype | None = None) -> Model:
        """A copy on `device` in `dtype` (norm weights and biases follow `dtype` too)."""
        moved = {n: t.to(device=device, dtype=dtype) for n, t in self.weights.items()}
        return Model(self.spec, moved, self.source, self.full_num_layers)

    def validate(self, where: str, experts_held: int = 0) -> None:
        """Raise ModelLoadError when the weights do not match the spec (names or shapes). `experts_held`: the experts
        an EP shard holds (its router still scores all of them), when not all."""
        expected = weight_shapes(self.spec)
        if experts_held:
            expected = {n: (experts_held, *s[1:]) if ".experts." in n else s for n, s in expected.items()}
        missing = [n for n in expected if n not in self.weights]
        if missing:
            raise ModelLoadError(f"{where}: missing weight {missing[0]!r} ({len(missing)} missing): "
                                 "config and weights do not match")
        for name, shape in expected.items():
            got = tuple(self.weights[name].shape)
            if got != shape:
                raise ModelLoadError(f"{where}: weight {name!r} has shape {list(got)}, the config implies "
                                     f"{list(shape)}: config and weights do not match")
        allowed_extra = {f"layers.{i}.router_bias" for i in range(self.spec.num_layers)}
        extra = [n for n in self.weights if n not in expected and n not in allowed_extra]
        if extra:
            raise ModelLoadError(f"{where}: unexpected weight {extra[0]!r} ({len(extra)} unexpected): "
                                 "config and weights do not match")
