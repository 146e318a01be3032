"""MoE routing: measured `RoutingProfile`s, and their replay on random-weight models.

A `RoutingProfile` is per-layer expert load [layers, experts] plus the mean number of distinct
experts a batch of b tokens activates (b = 1..max_batch), averaged over layers. Sources:

- a run of the MoE reference forward (`capture_routing`, through `routing_observer`);
- vLLM routed-experts arrays ([tokens, layers, top_k] ids saved with `numpy.save`) and SGLang
  expert-distribution dumps (`logical_count` [layers, experts] or [steps, layers, experts] in a
  `torch.save` file), which users bring from production;
- `parametric_routing`: Zipf-skewed loads for models without a measurement.

Replay (`replay_routing`, i.e. `fit_router_bias` + `apply_router_bias`) fits
`layers.{i}.router_bias`, the selection-only bias of `reference.route`, so a random-weight
model's per-layer load matches a target; the replayed model's source names the target profile,
and so do profiles captured from it. Distinct experts per batch then follow from the load and from
the correlation of real text tokens in a batch, which is why replay inputs must be real text:
synthetic inputs activate more distinct experts than real traffic does.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from athanor.errors import ConfigError
from athanor.model import BuildContext, Model, ModelSpec, make_prefill_batch
from athanor.model.reference import ReferenceForward

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RoutingProfile:
    source: str
    """Where the profile came from; results on a replayed profile cite it."""
    top_k: int
    load: tuple[tuple[float, ...], ...]
    """[layers][experts] share of the layer's top-k assignments (each row sums to 1)."""
    distinct: tuple[float, ...]
    """Mean distinct experts per layer activated by a batch of b tokens, for b = 1..len(distinct)."""

    @property
    def num_layers(self) -> int:
        return len(self.load)

    @property
    def num_experts(self) -> int:
        return len(self.load[0])

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @staticmethod
    def from_dict(d: dict[str, Any]) -> RoutingProfile:
        return RoutingProfile(d["source"], d["top_k"], tuple(tuple(r) for r in d["load"]), tuple(d["distinct"]))


def routing_from_topk(topk: list[np.ndarray], num_experts: int, source: str, max_batch: int = 64,
                      num_draws: int = 256, seed: int = 0) -> RoutingProfile:
    """A profile from per-layer expert ids [N, top_k] of the same N tokens (a dense layer among MoE ones: [0, top_k],
    its load uniform, as it routes nothing; the distinct-expert curve averages the MoE layers)."""
    rng = np.random.default_rng(seed)
    topk_moe = [ids for ids in topk if len(ids)]
    n, k = topk_moe[0].shape
    load = []
    for ids in topk:
        c = np.bincount(ids.ravel(), minlength=num_experts).astype(float) if len(ids) else np.ones(num_experts)
        load.append(tuple(float(x) for x in c / c.sum()))
    # Batch b is the first b tokens of a random permutation: nested batches, unbiased means.
    perms = np.argsort(rng.random((num_draws, n)), axis=1)[:, :max_batch]  # [D, max_batch]
    counts = np.zeros(max_batch)
    for ids in topk_moe:
        hit = np.zeros((num_draws, num_experts), dtype=bool)
        for b in range(min(max_batch, n)):
            rows = ids[perms[:, b]]  # [D, k]
            np.put_along_axis(hit, rows, True, axis=1)
            counts[b] += hit.sum(1).mean()
    distinct = [float(c / len(topk_moe)) for c in counts[: min(max_batch, n)]]
    return RoutingProfile(source, k, tuple(load), tuple(distinct))


class _Recorder(ReferenceForward):
    """The reference forward, remembering each MoE layer's chosen experts."""

    def __init__(self, model: Model, ctx: BuildContext) -> None:
        super().__init__(model, ctx)
        self.topk: dict[int, list[Tensor]] = {}
        self.routing_observer = lambda i, ids: self.topk.setdefault(i, []).append(ids.cpu())


def _run(model: Model, sequences: list[list[int]]) -> _Recorder:
    max_len = max(len(s) for s in sequences)
    ctx = BuildContext(max_seqs=len(sequences), max_seq_len=max_len, device=model.device, dtype=model.dtype)
    fwd = _Recorder(model, ctx)
    with torch.no_grad():
        fwd.prefill(make_prefill_batch(sequences, list(range(len(sequences))), device=model.device))
    return fwd


def capture_topk(model: Model, sequences: list[list[int]]) -> list[np.ndarray]:
    """Per layer, the expert ids [N, top_k] the reference forward picks for the N tokens of `sequences` ([0, top_k]
    for a dense layer among MoE ones)."""
    moe = model.spec.moe
    if moe is None:
        raise ConfigError(f"model {model.spec.name} is dense: routing needs an MoE model")
    rec = _run(model, sequences)
    return [torch.cat(rec.topk[i]).numpy() if i in rec.topk else np.zeros((0, moe.top_k), dtype=np.int64)
            for i in range(model.spec.num_layers)]


def capture_routing(model: Model, sequences: list[list[int]], source: str = "", max_batch: int = 64) -> RoutingProfile:
    """Run the reference forward over token `sequences` and record its routing. The profile's
    source defaults to `capture:` + the model's source (which names a replayed profile, if any)."""
    topk = capture_topk(model, sequences)
    assert model.spec.moe is not None
    return routing_from_topk(topk, model.spec.moe.num_experts, source or f"capture:{model.source}", max_batch)


def load_routing(path: str | Path, spec: ModelSpec, flag: str = "--routing") -> RoutingProfile:
    """A RoutingProfile JSON (`athanor traffic routing` writes one) for the MoE model `spec`; a file that is missing,
    not a profile, or of other layer or expert counts is refused in one line naming `flag`."""
    import json

    if spec.moe is None:
        raise ConfigError(f"{flag} {path}: {spec.name} has no experts to route")
    try:
        profile = RoutingProfile.from_dict(json.loads(Path(path).read_text()))
    except OSError as e:
        raise ConfigError(f"{flag} {path}: cannot read it ({e.strerror}); make one with athanor traffic routing") \
            from None
    except (json.JSONDecodeError, KeyError, TypeError, IndexError) as e:
        raise ConfigError(f"{flag} {path}: not a RoutingProfile JSON ({e}); make one with athanor traffic routing") \
            from None
    moe_layers = spec.num_layers - len(spec.dense_layers)
    if profile.num_experts != spec.moe.num_experts or profile.num_layers not in (spec.num_layers, moe_layers):
        raise ConfigError(f"{flag} {path}: {profile.num_layers} layers x {profile.num_experts} experts, but "
                          f"{spec.name} has {moe_layers} MoE layers x {spec.moe.num_experts} experts")
    return profile


def load_vllm_routed_experts(path: str | Path, num_experts: int, max_batch: int = 64) -> RoutingProfile:
    """A profile from a vLLM routed-experts array [tokens, layers, top_k] saved as .npy."""
    arr = np.load(path)
    if arr.ndim != 3:
        raise ConfigError(f"{path}: routed experts must be [tokens, layers, top_k], got shape {list(arr.shape)}")
    return routing_from_topk([arr[:, i, :] for i in range(arr.shape[1])], num_experts, f"vllm:{path}", max_batch)


def load_sglang_dump(path: str | Path, top_k: int, max_batch: int = 64) -> RoutingProfile:
    """A profile from an SGLang expert-distribution dump (`logical_count`). Counts carry no
    per-batch information, so distinct experts are those of independent tokens (an upper bound)."""
    d = torch.load(path, map_location="cpu", weights_only=True)
    counts = d.get("logical_count") if isinstance(d, dict) else d
    if not isinstance(counts, Tensor):
        raise ConfigError(f"{path}: no 'logical_count' tensor: is this an SGLang expert-distribution dump?")
    counts = counts.double()
    if counts.dim() == 3:
        counts = counts.sum(0)
    load = (counts / counts.sum(1, keepdim=True)).numpy()
    return _independent_profile(f"sglang:{path}", top_k, load, max_batch)


def load_selection_table(path: str | Path, top_k: int, where: dict[str, str] | None = None,
                         max_batch: int = 64) -> RoutingProfile:
    """A profile from a per-layer expert selection table: a CSV with a `Layer` column and `Expert_0` ..
    `Expert_{E-1}` columns holding each expert's selection frequency (or count) in that layer, as MoE
    analysis scripts write from a model's router logits over real text. Other columns select rows: `where`
    {"Language": "English"} keeps those rows, and one row per layer must remain. Like counts, a table carries
    no per-batch information, so distinct experts are those of independent tokens (an upper bound)."""
    import csv

    where = where or {}
    try:
        with open(path, newline="") as f:
            rows = list(csv.DictReader(f))
    except (OSError, UnicodeDecodeError, csv.Error) as e:
        raise ConfigError(f"{path}: cannot read a selection table ({e})") from None
    if not rows or "Layer" not in rows[0]:
        raise ConfigError(f"{path}: no 'Layer' column: a selection table has Layer, Expert_0, Expert_1, ... columns")
    experts = sorted((c for c in rows[0] if c.startswith("Expert_")), key=lambda c: int(c.split("_")[1]))
    for column, value in where.items():
        if column not in rows[0]:
            raise ConfigError(f"{path}: no column {column!r} to select on (columns: {', '.join(rows[0])[:200]})")
        rows = [r for r in rows if r[column] == value]
    layers = [int(r["Layer"]) for r in rows]
    if sorted(layers) != list(range(len(layers))) or not experts:
        raise ConfigError(f"{path}: need one row per layer 0..L-1 and Expert_ columns; found layers "
                          f"{sorted(layers)[:8]}... (select rows with --where COLUMN=VALUE)")
    table = np.array([[float(r[c]) for c in experts] for r in sorted(rows, key=lambda r: int(r["Layer"]))])
    if (table < 0).any() or (table.sum(1) <= 0).any():
        raise ConfigError(f"{path}: selection frequencies must be >= 0 with a positive sum in every layer")
    selected = ",".join(f"{k}={v}" for k, v in where.items())
    source = f"table:{Path(path).name}" + (f"[{selected}]" if selected else "")
    return _independent_profile(source, top_k, table / table.sum(1, keepdims=True), max_batch)


def _independent_profile(source: str, top_k: int, load: np.ndarray, max_batch: int) -> RoutingProfile:
    p = np.clip(load * top_k, 0, 1)  # chance that one token picks each expert
    distinct = [float(np.mean((1 - (1 - p) ** b).sum(1))) for b in range(1, max_batch + 1)]
    return RoutingProfile(source, top_k, tuple(tuple(float(x) for x in r) for r in load), tuple(distinct))


def parametric_routing(num_layers: int, num_experts: int, top_k: int, zipf: float = 0.8, seed: int = 0,
                       max_batch: int = 64) -> RoutingProfile:
    """Zipf-skewed per-layer load (a fresh expert order per layer). `zipf` 0.8 gives a hottest
    expert about 3-4x the mean at 64 experts, the order of the imbalance DeepSeek-V3's report
    motivates its load balancing with; distinct experts assume independent tokens."""
    rng = np.random.default_rng(seed)
    base = 1.0 / np.arange(1, num_experts + 1) ** zipf
    base /= base.sum()
    load = np.stack([rng.permutation(base) for _ in range(num_layers)])
    return _independent_profile(f"parametric:zipf{zipf}", top_k, load, max_batch)


class _Fitter(ReferenceForward):
    """The reference forward fitting each MoE layer's router bias on the hidden states that
    really reach it, just before the layer routes: layer i is fitted under the biases already
    fitted for layers < i, so one forward pass fits them all."""

    def __init__(self, model: Model, ctx: BuildContext, target: RoutingProfile, iters: int) -> None:
        super().__init__(model, ctx)
        self.target, self.iters = target, iters

    def _moe(self, i: int, x: Tensor) -> Tensor:
        moe = self.spec.moe
        assert moe is not None
        bias = _fit_layer(x.detach().float().cpu(), self.model.layer(i, "router").float().cpu(),
                          torch.tensor(self.target.load[i], dtype=torch.float32), moe.top_k, moe.scoring, self.iters)
        self.model.weights[f"layers.{i}.router_bias"] = bias.to(x.device, self.model.dtype)
        return super()._moe(i, x)


def _fit_layer(x: Tensor, router: Tensor, goal: Tensor, top_k: int, scoring: str, iters: int) -> Tensor:
    """Bias [E] whose top-k choice over scores of x [N, H] gives expert loads `goal` [E].

    A damped fixed-point iteration (raise an expert's bias while it gets less than its share),
    keeping the iterate whose loads are closest to the goal in total variation."""
    logits = x @ router.T  # [N, E]
    scores = torch.softmax(logits, -1) if scoring == "softmax" else torch.sigmoid(logits)
    num_experts = scores.shape[1]
    b = torch.zeros(num_experts)
    best, best_tvd = b.clone(), float("inf")
    lr = float(scores.std()) * num_experts
    for step in range(iters):
        ids = torch.topk(scores + b, top_k, dim=-1).indices
        load = torch.bincount(ids.flatten(), minlength=num_experts).float() / ids.numel()
        tvd = 0.5 * float((goal - load).abs().sum())
        if tvd < best_tvd:
            best, best_tvd = b.clone(), tvd
        b += lr * (0.99**step) * (goal - load)
    return best - best.mean()


def fit_router_bias(model: Model, target: RoutingProfile, sequences: list[list[int]], passes: int = 1,
                    iters: int = 400) -> dict[str, Tensor]:
    """Per-layer `router_bias` [E] making `model` route `sequences` with `target`'s load.

    One reference forward over `sequences`; each MoE layer's bias is fitted on the hidden states
    that reach its router (see `_Fitter`). Apply the result with `apply_router_bias`. `passes` is
    accepted for older callers: the layer-by-layer fit is already final after one pass.
    """
    del passes
    moe = model.spec.moe
    if moe is None:
        raise ConfigError(f"model {model.spec.name} is dense: routing replay needs an MoE model")
    if (target.num_layers, target.num_experts) != (model.spec.num_layers, moe.num_experts):
        raise ConfigError(f"routing profile {target.source} is [{target.num_layers}, {target.num_experts}], "
                          f"model {model.spec.name} is [{model.spec.num_layers}, {moe.num_experts}]")
    work = apply_router_bias(model, {f"layers.{i}.router_bias": torch.zeros(moe.num_experts)
                                     for i in range(model.spec.num_layers)})
    max_len = max(len(s) for s in sequences)
    ctx = BuildContext(max_seqs=len(sequences), max_seq_len=max_len, device=model.device, dtype=model.dtype)
    with torch.no_grad():
        _Fitter(work, ctx, target, iters).prefill(
            make_prefill_batch(sequences, list(range(len(sequences))), device=model.device))
    return {f"layers.{i}.router_bias": work.weights[f"layers.{i}.router_bias"] for i in range(model.spec.num_layers)}


def apply_router_bias(model: Model, biases: dict[str, Tensor], profile_source: str | None = None) -> Model:
    """A `Model` sharing `model`'s weights plus `biases` (the replayed routing). With
    `profile_source`, the model's source names the profile it replays, so results say so."""
    weights = dict(model.weights)
    weights.update({k: v.to(model.device, model.dtype) for k, v in biases.items()})
    source = model.source if profile_source is None else f"{model.source}+routing[{profile_source}]"
    return Model(model.spec, weights, source, model.full_num_layers)


def replay_routing(model: Model, target: RoutingProfile, sequences: list[list[int]]) -> Model:
    """`model` with router biases fitted so it routes `sequences` as `target` says, its source
    naming `target.source`."""
    return apply_router_bias(model, fit_router_bias(model, target, sequences), target.source)


def compare_routing(a: RoutingProfile, b: RoutingProfile) -> tuple[float, float]:
    """(max per-layer total-variation distance of load, max relative error of distinct experts)."""
    tvd = max(0.5 * float(np.abs(np.asarray(x) - np.asarray(y)).sum()) for x, y in zip(a.load, b.load, strict=False))
    n = min(len(a.distinct), len(b.distinct))
    rel = max(abs(a.distinct[i] - b.distinct[i]) / a.distinct[i] for i in range(n))
    return tvd, float(rel)
