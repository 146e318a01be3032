"""`CompileConfig`: one compile session's inputs, with defaults sized for the device."""

from __future__ import annotations

import functools
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from athanor.agents.config import AgentsConfig
from athanor.errors import ConfigError
from athanor.evaluate import EvaluateConfig, QualityBudget
from athanor.loop.memory import MemoryPlan, device_bytes, plan_engine_slots
from athanor.loop.reserve import confirmation_key
from athanor.model.device import resolve_dtype
from athanor.model.registry import load_spec

MIN_SEARCH_SHARE = 0.25
"""The least of a budget the search keeps: a budget whose confirmation would leave less is too small."""


@dataclass(frozen=True)
class CompileConfig:
    model: str = "smollm2-135m"
    traffic: str = "preset:chat"
    """A trace file, a saved profile, or `preset:chat|code|agent` (the built-in default needs no file)."""
    budget_s: float = 600.0
    """Wall-clock budget of the session, confirmation included: proposals stop `reserve_s` before it, what
    confirming one candidate costs here, and further confirmations run only where they fit. Set-up (loading the
    model, starting the first engines) comes before the clock starts."""
    agents: tuple[str, ...] = ("variant",)
    device: str = "cpu"
    dtype: str = ""
    out_dir: Path = Path("runs/latest")
    dashboard: str = ""
    """The base URL of an `athanor dashboard` over this run's store: report.md links the run's pages there."""
    resume: bool = False
    bitwise: bool = False
    """Demand logits identical to the reference's (excludes `quality`)."""
    quality: QualityBudget | None = None
    """Quality mode: admit lossy candidates (and search lossy moves) within this KL / perplexity budget
    instead of the dtype's tolerance. None: candidates match the reference within that tolerance."""
    seed: int = 0
    max_seqs: int = 0
    """Engine slots (largest timed decode batch); 0: the device's default."""
    max_seq_len: int = 0
    """Longest context the engines hold (prefill chunks are clipped to half); 0: the device's default."""
    fast_layers: int = 0
    """Layers of the fast tier; 0: a fifth of the model (at least 2), so that layer work, not the LM head,
    dominates what the fast tier sees."""
    confirm_reserve_s: float = 0.0
    """Seconds kept back for the slow-tier confirmation; 0: the device's default."""
    incumbent: Path | None = None
    """A candidate directory (`candidate.py` + `manifest.json`, as `winner/` and the server's `--candidate`) to
    beat: every candidate is timed against it instead of the reference forward, the reference itself is the
    first contender, and a winner must be faster than it. None: everything is quoted against the reference."""
    store: str = ""
    """The experiment store (a path or a `postgresql://` URL, shared by the runs of a team); empty: a SQLite file in
    `out_dir`."""
    cluster: str = ""
    """A Ray cluster (`auto`, `HOST:PORT`, `ray://HOST:PORT`) whose screeners run the fast tier in parallel
    (`athanor.loop.cluster`); empty: this machine's fast tier, and Ray is not imported."""
    layouts: tuple[str, ...] = ()
    """Parallel layouts (`athanor plan`'s names: tp2, tp2.ep2) in which the session's best forward is confirmed
    after the search, each timed in device-seconds against the baseline (`athanor.loop.layouts`); empty: one
    device only."""
    agents_config: AgentsConfig = field(default_factory=AgentsConfig)

    def __post_init__(self) -> None:
        if self.bitwise and self.quality is not None:
            raise ConfigError("--bitwise and --quality-budget exclude each other: --bitwise demands the reference's "
                              "exact outputs, a quality budget admits lossy ones; pass one of them")

    @property
    def on_cpu(self) -> bool:
        return self.device == "cpu"

    @property
    def precision(self) -> dict[str, Any]:
        """How candidates are judged, as the run's store and report record it: `mode` "default",
        "bitwise" or "quality", and `quality_budget` (max_kl, max_ppl_increase) in quality mode."""
        mode = "quality" if self.quality is not None else "bitwise" if self.bitwise else "default"
        return {"mode": mode, "quality_budget": asdict(self.quality) if self.quality is not None else None}

    def evaluate_config(self, tier: str) -> EvaluateConfig:
        """The evaluator of one tier. On a 2-core CPU the slow tier (the whole model) is timed on fewer
        pairs and shorter prefills, or one confirmation would outlast a demo's budget; its interval
        says what that costs in certainty."""
        base = EvaluateConfig(
            model=self.model, device=self.device, dtype=self.dtype, tier=tier,
            fast_layers=self.fast_tier_layers,
            traffic=self.traffic, bitwise=self.bitwise, quality=self.quality,
            max_seqs=self.max_seqs or (16 if self.on_cpu else self.gpu_plan.max_seqs),
            max_seq_len=self.engine_max_seq_len,
            seed=None,
        )
        if not self.on_cpu:
            if tier == "slow":
                return base
            # On a GPU an evaluation's cost is its scripts' set-up and checks, not its layers, so the screen is
            # made cheap as on a CPU: one decode shape, half the decode pairs (a GPU's decode intervals are
            # narrow), a capped check, and one round of pairs per shape (no time budget: narrowing an interval
            # further is a precision a screen does not need). Prefill keeps its pairs, as an eager prefill's A/A
            # interval is wide on fewer. The slow tier keeps the defaults and confirms.
            return replace(base, max_decode_shapes=1, decode_pairs=30, check_tokens=8192, timing_budget_s=0.0)
        # On a 2-core CPU one step of the whole model takes ~0.1-1 s: time fewer pairs (the interval
        # says what that costs in certainty) and only the shapes that carry the workload.
        cpu = replace(base, max_decode_shapes=1, check_tokens=2048, timing_budget_s=0.5, warmup=2,
                      max_seq_len=min(base.max_seq_len, 768))
        if tier == "slow":
            # The confirmation is the run's verdict, so it buys certainty a noisy 2-core machine needs: a third
            # pooled round, run only when two left the A/A interval too wide; twelve prefill pairs and thirty
            # decode pairs, as a round's cost is its prompts' set-up rather than its pairs (the decode pairs still
            # fit one prompt round), and fewer let the same candidate's ratio swing from run to run.
            return replace(cpu, decode_pairs=30, prefill_pairs=12, warmup=1, max_attempts=3)
        return replace(cpu, decode_pairs=16, prefill_pairs=6)

    @property
    def fast_tier_layers(self) -> int:
        return self.fast_layers or max(2, load_spec(self.model).num_layers // 5)

    @property
    def engine_max_seq_len(self) -> int:
        return self.max_seq_len or (1024 if self.on_cpu else 4096)

    @functools.cached_property
    def gpu_plan(self) -> MemoryPlan:
        """Engine slots when --max-seqs is not given on a GPU: up to 64, as many as the two tiers' four
        engine workers can hold at once (`athanor.loop.memory`)."""
        import torch

        spec = load_spec(self.model)
        # "": as stored, fp32 for the random presets
        itemsize = resolve_dtype(self.dtype, torch.device(self.device)).itemsize if self.dtype else 4
        return plan_engine_slots(spec, itemsize, (self.fast_tier_layers, spec.num_layers), self.engine_max_seq_len,
                                 device_bytes(self.device), 64)

    def reserve_s(self, measured: float | None = None) -> float:
        """Seconds of the budget kept for confirming on the slow tier: `confirm_reserve_s` when set, else `measured`
        (what this machine's earlier confirmations cost: `athanor.loop.reserve`), else the device's default, which
        is a guess and so gives way to the search's share (`MIN_SEARCH_SHARE`) of a small budget."""
        if self.confirm_reserve_s or measured:
            return float(self.confirm_reserve_s or measured or 0.0)
        return min(75.0 if self.on_cpu else 120.0, (1 - MIN_SEARCH_SHARE) * self.budget_s)

    def smallest_budget_s(self, reserve: float) -> float:
        """The least budget that confirms one candidate in `reserve` seconds and searches `MIN_SEARCH_SHARE`."""
        return reserve / (1 - MIN_SEARCH_SHARE)

    @property
    def confirmation_key(self) -> str:
        """Under what this run's confirmations are recorded (`athanor.loop.reserve`)."""
        return confirmation_key(self.model, self.device, self.dtype, load_spec(self.model).num_layers)
