"""`EvaluateConfig`: what one evaluator checks and times, with defaults sized for a CPU test or an H200."""

from __future__ import annotations

from dataclasses import dataclass, field

from athanor.evaluate.correctness import QualityBudget


@dataclass(frozen=True)
class StageTimeouts:
    """Seconds each stage may take; past it the candidate is rejected at that stage ("timeout")."""

    start_s: float = 600.0
    """An engine worker's start (model load)."""
    swap_s: float = 600.0
    """Import, build, graph capture and first step of the candidate (torch.compile may be slow)."""
    smoke_s: float = 60.0
    check_s: float = 300.0
    """The correctness script (incumbent, candidate and incumbent again, plus the reference)."""
    timing_s: float = 300.0
    """One timed shape."""


@dataclass(frozen=True)
class EvaluateConfig:
    """One evaluator: a model on a device, a traffic profile, and how strictly to judge."""

    model: str
    """A model name or path as `athanor.model.registry.load_model` accepts."""
    device: str = "cpu"
    dtype: str = ""
    """torch dtype name; empty: as stored (fp32 for random presets and the embedded model)."""
    tier: str = "fast"
    """"fast" (a model cut to `fast_layers` layers, projected), "slow" (the whole model) or "both"."""
    fast_layers: int = 2
    """Layers of the fast tier: enough to be representative, few enough that a measurement takes well
    under a second."""
    traffic: str = "preset:chat"
    """The traffic whose workload the objective prices: `preset:NAME`, a saved profile or a trace."""
    bitwise: bool = False
    """Demand logits identical to the reference's in the same dtype."""
    quality: QualityBudget | None = None
    """Admit lossy candidates within this budget instead of the dtype tolerance."""
    margin: float = 0.01
    """Promote only when the speedup interval's lower bound exceeds 1 + margin (+ the A/A bias)."""
    incumbent_drift: float = 0.05
    """Refuse to accept when the incumbent ran at least this much slower (the interval's lower bound) beside the
    challenger than by itself, and still does alone: a challenger that slows its rivals, the twin alike, would
    otherwise win by it."""
    calibration_steps: int = 4
    """Timed steps per shape (each run by the incumbent and its twin) of the incumbent's calibration: its time
    alone, before a challenger is loaded."""
    max_seqs: int = 8
    max_seq_len: int = 256
    decode_pairs: int = 60
    """Timed decode steps per shape at least (each runs incumbent, candidate and incumbent again); also
    the decode steps one prompt round leaves room for (the timed context is clipped to fit them)."""
    prefill_pairs: int = 32
    """Timed prefill steps per shape at least."""
    check_tokens: int = 0
    """Cap on the prompt tokens of each batch of the correctness script (0: up to max_seqs x
    max_seq_len / 2); bounds the check's cost on a slow device, shapes still vary."""
    timing_budget_s: float = 1.0
    """Seconds of timed runs (all three sides) per shape: after the first `*_pairs` steps, more are run
    until their step time fills this budget, so short steps get many pairs and long ones the minimum.
    The wall time is about twice this (checks, the reference's run, warm-up)."""
    max_pairs: int = 1000
    """Timed steps per shape at most."""
    precision: float = 0.01
    """Half-width sought for each shape's A/A interval (the incumbent against itself). A shape still
    noisier after `timing_budget_s` (an eager, host-bound prefill on a GPU is) is timed on further
    rounds of pairs, up to `max_budget_factor` times the budget: more pairs narrow the interval."""
    max_budget_factor: float = 4.0
    warmup: int = 4
    """Steps per shape run (and verified) but not timed."""
    max_decode_shapes: int = 2
    max_prefill_shapes: int = 1
    noise_limit: float = 0.10
    """An A/A interval wider than this on either side means the machine is noisy: each shape is timed again
    on fresh inputs and the new pairs pooled with the earlier ones, up to `max_attempts` rounds in all, then
    judged as "error" ("too noisy to judge")."""
    max_attempts: int = 2
    physical_slack: float = 1.25
    """A step faster than bytes / measured bandwidth by more than this factor is refused as impossible."""
    static_checks: bool = True
    """False skips the static stage (only to test that the runtime defences stand on their own)."""
    sandbox: bool = True
    seed: int | None = None
    """Seed of the scripts and fingerprints; None: fresh per evaluation, so no candidate can prepare for it."""
    timeouts: StageTimeouts = field(default_factory=StageTimeouts)

    def tiers(self) -> tuple[str, ...]:
        return {"fast": ("fast",), "slow": ("slow",), "both": ("fast", "slow")}[self.tier]
