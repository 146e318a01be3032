"""Variant search: compose moves (`athanor.moves`) into candidates, learning from verdicts with Optuna.

Each trial chooses a value for every option of the template candidate that matters on this
device; the rendered source is the proposal. Its value is the log of the fast-tier speedup over
the reference, so TPE learns which moves pay off here. A candidate the evaluator rejects before
timing (wrong outputs, a crash) is a failed trial: TPE learns to avoid that region too.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import optuna
from optuna.distributions import BaseDistribution, CategoricalDistribution

from athanor.agents.base import AgentContext, Proposal
from athanor.agents.board import Board
from athanor.moves import MOVES_BY_NAME, baseline_options, best_options, read_options, render, search_space
from athanor.store import EvaluationRecord

log = logging.getLogger(__name__)
optuna.logging.set_verbosity(optuna.logging.WARNING)

_TIMED_STAGES = ("timing", "slow", "accepted")
"""Stages at which a candidate has been timed: its speedup is a measurement, not a failure."""


@dataclass(frozen=True)
class VariantConfig:
    device: str = "cpu"
    moe: bool = False
    seed: int = 0
    include_compile: bool = False
    """Search torch.compile modes too. Off on a short CPU budget: one compile of the decode step takes
    about a minute on 2 cores, which the objective charges to the candidate anyway."""
    lossy: bool = False
    """Search the lossy moves too (lower-precision weights): quality mode only, where the evaluator
    admits candidates by a KL / perplexity budget."""
    template: str = "fast"


def device_search_space(config: VariantConfig) -> dict[str, tuple[Any, ...]]:
    """The options worth searching on this device, and their values.

    On a CPU the Triton values fall back to the same torch code (so searching them only repeats
    measurements) and there are no CUDA graphs to capture.
    """
    space: dict[str, tuple[Any, ...]] = {}
    for name, values in search_space(config.moe, lossy=config.lossy).items():
        if config.device == "cpu":
            cuda_only = MOVES_BY_NAME[name].cuda_only
            values = tuple(v for v in values if not str(v).startswith("triton") and v not in cuda_only)
            if name == "graphs":
                continue
        else:
            values = tuple(v for v in values if v not in MOVES_BY_NAME[name].cpu_only)
        if name == "compile" and not config.include_compile:
            continue
        if len(values) > 1:
            space[name] = values
    return space


def fixed_options(config: VariantConfig) -> dict[str, Any]:
    """Options held at one value: the CPU declares no graphs (nothing would capture them)."""
    return {"graphs": False} if config.device == "cpu" else {}


class VariantSearch:
    """The `variant` agent."""

    def __init__(self, config: VariantConfig | None = None, board: Board | None = None) -> None:
        self.config = config or VariantConfig()
        self.name = "variant"
        self.board = board
        self.space = device_search_space(self.config)
        self.distributions: dict[str, BaseDistribution] = {
            n: CategoricalDistribution(list(v)) for n, v in self.space.items()}
        sampler = optuna.samplers.TPESampler(seed=self.config.seed, n_startup_trials=4)
        self.study = optuna.create_study(direction="maximize", sampler=sampler)
        self._pending: dict[str, optuna.trial.Trial] = {}
        self._seen: set[tuple[tuple[str, Any], ...]] = set()
        """Option points already proposed or evaluated. Points, not candidate ids: a resumed run's candidates
        may have been rendered from an older template, so the same point renders to another source now."""
        # Start from what is known to be good (in quality mode, its lossy form first), then let TPE explore.
        for lossy in sorted({self.config.lossy, False}, reverse=True):
            self.study.enqueue_trial(self._restrict({**baseline_options(), **best_options_for(self.config, lossy)}))

    def _restrict(self, options: dict[str, Any]) -> dict[str, Any]:
        return {n: v for n, v in options.items() if n in self.space and v in self.space[n]}

    def _render(self, params: dict[str, Any]) -> str:
        return render(self.config.template, {**fixed_options(self.config), **params})

    def propose(self, context: AgentContext) -> list[Proposal]:
        proposals: list[Proposal] = []
        attempts = 0
        while len(proposals) < context.num_proposals and attempts < 20 * context.num_proposals:
            attempts += 1
            trial = self.study.ask(self.distributions)
            source = self._render(trial.params)
            proposal = Proposal(source, parent_id=context.incumbent_id, author=self.name,
                                description=describe(trial.params))
            point = _point(trial.params)
            if point in self._seen:
                # TPE may ask for a point it already has; tell it nothing new and draw again.
                self.study.tell(trial, state=optuna.trial.TrialState.PRUNED)
                continue
            self._seen.add(point)
            self._pending[proposal.candidate_id] = trial
            proposals.append(proposal)
        return proposals

    def observe(self, verdicts: Sequence[EvaluationRecord]) -> None:
        for ev in verdicts:
            trial = self._pending.pop(ev.candidate_id, None)
            if trial is None or ev.tier != "fast":
                if trial is not None:
                    self._pending[ev.candidate_id] = trial
                continue
            if ev.stage in _TIMED_STAGES and ev.speedup > 0 and math.isfinite(ev.speedup):
                self.study.tell(trial, math.log(ev.speedup))
                if self.board is not None and ev.accepted:
                    self.board.result(self.name, f"{describe(trial.params)}: x{ev.speedup:.3f} on the fast tier "
                                                 f"[{ev.speedup_ci_low:.3f}, {ev.speedup_ci_high:.3f}]",
                                      candidate_id=ev.candidate_id)
            else:
                self.study.tell(trial, state=optuna.trial.TrialState.FAIL)
                if self.board is not None:
                    self.board.warning(self.name, f"{describe(trial.params)} failed at {ev.stage}: {ev.reason}",
                                       candidate_id=ev.candidate_id)

    def warm_start(self, history: Sequence[tuple[str, EvaluationRecord]]) -> None:
        """Re-learn from a resumed run's fast-tier evaluations: (candidate source, record) pairs."""
        for source, ev in history:
            try:
                options = read_options(source)
            except Exception:  # an edited or foreign candidate: not a point of this search space
                continue
            params = {n: options.get(n, baseline_options()[n]) for n in self.space}
            if any(v not in self.space[n] for n, v in params.items()):
                continue
            timed = ev.stage in _TIMED_STAGES and ev.speedup > 0 and math.isfinite(ev.speedup)
            self.study.add_trial(optuna.trial.create_trial(
                params=params, distributions=self.distributions,
                value=math.log(ev.speedup) if timed else None,
                state=optuna.trial.TrialState.COMPLETE if timed else optuna.trial.TrialState.FAIL))
            self._seen.add(_point(params))


def _point(params: dict[str, Any]) -> tuple[tuple[str, Any], ...]:
    return tuple(sorted(params.items()))


def best_options_for(config: VariantConfig, lossy: bool = False) -> dict[str, Any]:
    """The hand-picked best options for this device (the first trial), with the lossy moves' if asked."""
    from athanor.model.presets import get_preset

    spec = get_preset("tiny-moe" if config.moe else "tiny-dense")
    return best_options(spec, config.device, lossy=lossy)


def describe(params: dict[str, Any]) -> str:
    """The options that differ from the reference's, e.g. "fused_qkv, attention=torch_per_seq"."""
    base = baseline_options()
    changed = [n if v is True else f"{n}={v}" for n, v in params.items() if v != base.get(n)]
    return ", ".join(changed) or "the template at its baseline options"
