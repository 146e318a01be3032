"""One compile session: profile -> workload -> agents -> fast-tier screening -> slow-tier confirmation -> winner.

Every candidate is timed against the session's baseline, first on the fast tier (a few layers,
projected to the whole model); the best fast-tier winners are confirmed on the slow tier (the
whole model). The baseline is the reference forward, or, with `CompileConfig.incumbent`, a given
candidate directory (what a server deploys now): then the reference forward is the first
contender proposed, and a winner is a candidate confirmed faster than that incumbent. Correctness
is always judged against the reference. Everything lands in the run's store as it happens, so
Ctrl-C keeps every result and `--resume` continues the run.

The search ends when the budget (read on the session's `clock`) runs out, when every agent has
nothing new to propose, or after `max_candidates` proposals: a caller that needs a run of known
length (a test, a benchmark) bounds it by candidates or by a clock it controls, not by wall time.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from athanor.agents.base import Agent, AgentContext, AgentError
from athanor.agents.board import Board
from athanor.agents.budget import BudgetAllocator
from athanor.agents.registry import make_agents, register_agent
from athanor.agents.variant import VariantConfig, VariantSearch
from athanor.engine.candidate import Candidate, baseline_candidate
from athanor.evaluate import Evaluator, Speedup, Verdict
from athanor.evaluate.timing import worth_confirming
from athanor.loop.config import CompileConfig
from athanor.loop.layouts import check_layouts, in_layout
from athanor.loop.report import write_report
from athanor.loop.reserve import check_budget, measured_reserve, record_confirmation
from athanor.loop.start import load_incumbent, start_or_resume, stored_verdicts
from athanor.loop.status import (
    SessionStatus,
    StatusHook,
    model_summary,
    no_status,
    precision_flags,
    verdict_line,
)
from athanor.store import EvaluationRecord, Store, open_store
from athanor.traffic import TrafficProfile, load_profile

if TYPE_CHECKING:
    from athanor.loop.cluster import Confirmer, ScreenPool

log = logging.getLogger(__name__)
Events = Callable[[str], None]
Clock = Callable[[], float]
"""Seconds on a monotonic scale (`time.monotonic`): what the session measures its budget on."""


@dataclass(frozen=True)
class CompileReport:
    """What a session concluded (the whole record is `out_dir/report.json`)."""

    run_id: str
    out_dir: Path
    verified: bool
    winner_id: str | None
    speedup: dict[str, float] = field(default_factory=dict)
    interrupted: bool = False
    summary: dict[str, Any] = field(default_factory=dict)


def _variant_factory(config: CompileConfig) -> Callable[..., Agent]:
    def make(agents_config: Any, board: Board | None) -> Agent:
        return VariantSearch(agents_config.variant or VariantConfig(device=config.device), board=board)
    return make


class Session:
    def __init__(self, config: CompileConfig, on_event: Events, *, clock: Clock = time.monotonic,
                 max_candidates: int | None = None, status: StatusHook = no_status) -> None:
        if max_candidates is not None and max_candidates < 1:
            raise ValueError(f"max_candidates must be at least 1 (or None), not {max_candidates}")
        self.config = config
        self.emit = on_event
        self.status = status
        """Told where the session stands (`SessionStatus`) whenever what it does changes: a status line's feed."""
        self.clock = clock
        """The budget's clock: the search stops, and confirmations past the first are skipped, by its reading
        (what a run and a confirmation cost, the report's and the reserve's figures, is wall time all the same)."""
        self.max_candidates = max_candidates
        """Proposals screened in this session after which the search stops (None: the budget alone stops it)."""
        self.screened = 0
        """Proposals screened so far in this session (the reference as a contender is nobody's proposal)."""
        self.pool: ScreenPool | None = None
        """The cluster's screeners (`CompileConfig.cluster`); None: screening on this machine's fast tier."""
        self.workers_lost: list[str] = []
        """Which screener died during which screen (the report names them)."""
        self.reserve = 0.0
        """Seconds of the budget kept for the first confirmation (set as the run starts)."""
        self._budget_start = clock()
        """Where the budget starts on `clock` (reset as the run starts)."""
        # Every input is checked before anything is written, so a bad flag leaves no half-made run.
        self.profile: TrafficProfile = load_profile(config.traffic)
        from athanor.model.registry import load_spec

        self.spec = load_spec(config.model)
        check_layouts(config.model, config.layouts, config.device)
        register_agent("variant", _variant_factory(config))
        variant = VariantConfig(device="cpu" if config.on_cpu else "cuda", moe=self.spec.moe is not None,
                                seed=config.seed, include_compile=config.budget_s >= 600,
                                lossy=config.quality is not None)
        agents_config = dataclasses.replace(config.agents_config, variant=variant)
        make_agents(list(config.agents), agents_config)  # raises on an unknown agent or a missing key
        self.incumbent: Candidate | None = load_incumbent(config.incumbent) if config.incumbent is not None else None
        self.reference = baseline_candidate()
        self.baseline: Candidate = self.incumbent or self.reference
        """What every candidate is timed against (and a winner must beat)."""
        config.out_dir.mkdir(parents=True, exist_ok=True)
        self.store: Store = open_store(config.store or config.out_dir)
        self.run_id = start_or_resume(self.store, config, self.profile, self.reference, self.incumbent, on_event)
        self.board = Board(self.store, self.run_id)
        self.agents = make_agents(list(config.agents), agents_config, board=self.board)
        self.budget = BudgetAllocator([a.name for a in self.agents])
        self.sources: dict[str, Candidate] = {self.baseline.id: self.baseline, self.reference.id: self.reference}
        self.fast_verdicts: dict[str, Verdict] = {}
        self.slow_verdicts: dict[str, Verdict] = {}
        # On --resume: the candidates and verdicts so far, and the variant search's history.
        history = stored_verdicts(self.store, self.run_id, self.sources, self.fast_verdicts, self.slow_verdicts)
        for agent in self.agents:
            if isinstance(agent, VariantSearch):
                agent.warm_start(history)

    # -- the loop -----------------------------------------------------------------------------
    def run(self) -> CompileReport:
        cfg = self.config
        started = time.monotonic()
        self._budget_start = self.clock()
        deadline = self._budget_start + cfg.budget_s
        interrupted = False
        fast = Evaluator(cfg.evaluate_config("fast"))
        slow: Evaluator | Confirmer = Evaluator(cfg.evaluate_config("slow"))
        if cfg.cluster:
            from athanor.loop.cluster import ScreenPool

            self._show(f"starting the screeners on the cluster {cfg.cluster}")
            self.pool = ScreenPool(cfg.cluster, cfg.evaluate_config("fast"))
            nodes = len({pl.node_id for pl in self.pool.placements})
            self.emit(f"cluster {cfg.cluster}: {len(self.pool)} screeners on {nodes} node(s)")
        measured = measured_reserve(cfg.confirmation_key)
        reserve = cfg.reserve_s(measured) * self.confirmations
        self.reserve = reserve
        why = (" (by this machine's last confirmations)" if measured and not cfg.confirm_reserve_s else
               "" if cfg.confirm_reserve_s else " (a first guess: this machine has confirmed none yet)")
        ends = time.strftime("%H:%M", time.localtime(time.time() + cfg.budget_s))
        try:
            self.emit(f"run {self.run_id}: {cfg.model} on {cfg.device}, traffic {cfg.traffic}, "
                      f"budget {cfg.budget_s:.0f} s: {cfg.budget_s - reserve:.0f} s to search, {reserve:.0f} s to "
                      f"confirm{why}; ends about {ends}, "
                      f"agents {', '.join(a.name for a in self.agents)}"
                      + (f", quality mode ({precision_flags(cfg.precision)})" if cfg.quality is not None else "")
                      + (f", against incumbent {self.baseline.id} ({cfg.incumbent})" if self.incumbent else "")
                      + (f"; {cfg.gpu_plan.describe()}" if not cfg.on_cpu and not cfg.max_seqs else ""))
            self._search(fast, deadline, guess=not (measured or cfg.confirm_reserve_s))
            if self.pool is not None:
                slow.close()
                self._show("reserving a worker of the cluster to confirm on")
                confirmer = self.pool.confirmer(cfg.evaluate_config("slow"))
                self.emit(f"confirming on the cluster's worker {confirmer.where}")
                slow = confirmer
            self._confirm(slow, deadline, fast.config.margin)
            self._confirm_layouts(slow, deadline)
        except KeyboardInterrupt:
            interrupted = True
            self.emit("interrupted: every result so far is in the store; --resume continues the run")
        finally:
            self._show("stopping the engines")
            fast.close()
            slow.close()
            if self.pool is not None:
                self.pool.close()
        self._show("writing the report")
        summary = write_report(self, time.monotonic() - started, interrupted)
        status = "interrupted" if interrupted else "finished"
        self.store.finish_run(self.run_id, status=status, summary=summary)
        return CompileReport(self.run_id, cfg.out_dir, bool(summary["verified"]), summary.get("winner_id"),
                             summary.get("speedup", {}), interrupted, summary)

    def _search(self, fast: Evaluator, deadline: float, guess: bool) -> None:
        """Screen proposals until `self.reserve` before `deadline`. `guess`: the reserve is the device's default, not
        this machine's record, and the first screen revises it (`_revise_reserve`)."""
        # Against a given incumbent the reference forward is a contender too, and the first one: a
        # stale deployed candidate may well be slower than it.
        if self.incumbent is not None and self.reference.id not in (self.incumbent.id, *self.fast_verdicts):
            self._screen(fast, self.reference)
        active = {a.name: a for a in self.agents}
        if self.pool is not None:
            self._stream(active, deadline, fast.config.margin)
            return
        while not self._search_over(deadline) and active:
            for cand in self._propose(active):
                if self._search_over(deadline):  # screens take time: the search may end inside a round
                    break
                self._register(cand)
                started = self.clock()
                self._screen(fast, cand)
                self.screened += 1
                if guess and self.screened == 1:
                    self._revise_reserve(self.clock() - started, deadline)

    def _propose(self, active: dict[str, Agent]) -> list[Candidate]:
        """The proposals of the agent the budget chooses next; none once every agent in `active` has stopped (an agent
        that fails or has nothing new leaves it)."""
        while active:
            agent = active[self.budget.choose(list(active))]
            self._show(f"agent {agent.name} proposing")
            try:
                proposals = agent.propose(self._context())
            except AgentError as e:
                self.board.warning(agent.name, str(e))
                self.emit(f"{agent.name}: {e} (agent stopped)")
                del active[agent.name]
                continue
            if not proposals:
                self.emit(f"{agent.name}: nothing new to propose")
                del active[agent.name]
                continue
            return [Candidate.from_source(p.source, parent=p.parent_id, author=p.author, description=p.description)
                    for p in proposals]
        return []

    def _stream(self, active: dict[str, Agent], deadline: float, margin: float) -> None:
        """Screen on the cluster: a screener that is done gets the next proposal at once, so none waits on another's
        screen; once the search is over, the screens in flight finish and count."""
        pool = self.pool
        assert pool is not None
        pending: deque[Candidate] = deque()
        while True:
            limit = math.inf if self.max_candidates is None else self.max_candidates
            while pool.free and self.screened + pool.in_flight < limit and not self._search_over(deadline):
                if not pending:
                    pending.extend(self._propose(active))
                    if not pending:
                        break
                cand = pending.popleft()
                self._register(cand)
                pool.submit(cand, self.baseline)
            if not pool.in_flight:
                return
            self._show(f"screening {pool.in_flight} candidate(s) on {len(pool)} screeners")
            cand, verdict = pool.next()
            if verdict.stage == "worker-lost":  # recorded, told to nobody: the candidate is screened again
                self.store.record_verdict(self.run_id, verdict.to_dict(), tier="fast")
                self.workers_lost.append(verdict.reason)
                self.emit(f"[fast] {cand.id} {verdict.reason}")
                continue
            self._screened(cand, verdict, margin)
            self.screened += 1

    def _register(self, cand: Candidate) -> None:
        self.sources[cand.id] = cand
        m = cand.manifest
        self.store.add_candidate(self.run_id, cand.source, parent_id=m.parent, author=m.author,
                                 description=m.description, manifest=m.__dict__)

    def _revise_reserve(self, first_screen_s: float, deadline: float) -> None:
        """With no record of what confirming costs here, take the first screen's cost (its engines' start and one
        evaluation of the fast tier's layers) scaled to the whole model's layers, where that is more than the
        default: a first run on a new machine then keeps its budget too."""
        cfg = self.config
        scaled = first_screen_s * self.spec.num_layers / cfg.fast_tier_layers * self.confirmations
        if scaled > self.reserve:
            self.reserve = scaled
            left = max(0.0, deadline - self.clock() - scaled)
            self.emit(f"confirming will take about {scaled:.0f} s (the first screen, {first_screen_s:.0f} s, scaled "
                      f"to the whole model): {left:.0f} s left to search")

    def _search_over(self, deadline: float) -> bool:
        """The budget's search share is spent, or `max_candidates` proposals are screened."""
        return (self.clock() >= deadline - self.reserve
                or (self.max_candidates is not None and self.screened >= self.max_candidates))

    def _screen(self, fast: Evaluator, cand: Candidate) -> None:
        """Time one candidate on the fast tier against the baseline; record it and tell the agents."""
        self._show(f"screening {cand.id} by {cand.manifest.author or 'nobody'}")
        self._screened(cand, fast.evaluate(cand, self.baseline), fast.config.margin)

    def _screened(self, cand: Candidate, verdict: Verdict, margin: float) -> None:
        """Record a fast-tier verdict and tell the agents and the budget."""
        self.fast_verdicts[cand.id] = verdict
        record = self.store.record_verdict(self.run_id, verdict.to_dict(), tier="fast")
        for a in self.agents:
            a.observe([record])
        if record.author in self.budget.agents:  # the reference is nobody's proposal
            self.budget.record_evaluation(record)
        self.emit(verdict_line("fast", cand.manifest.author, cand.manifest.description, verdict, margin))

    def _confirm(self, slow: Evaluator | Confirmer, deadline: float, margin: float) -> None:
        """Confirm what the fast tier's screen forwards (`worth_confirming` against its `margin`) on the whole
        model, best projected cost first, while time remains."""
        ranked = sorted((v for v in self.fast_verdicts.values() if worth_confirming(v, margin) and v.candidate_id
                         not in self.slow_verdicts), key=lambda v: v.gpu_s_per_1k_requests)
        if not ranked:
            self.emit("no candidate passed the fast tier's screen: nothing to confirm")
        last = self.reserve
        for i, verdict in enumerate(ranked):
            # The first confirmation always runs (the reserve was kept for it); another only where it fits the
            # budget, costing what the one before it did.
            if self.slow_verdicts and self.clock() + last > deadline:
                break
            started, on_clock = time.monotonic(), self.clock()
            slow_verdict = self._confirm_one(slow, self.sources[verdict.candidate_id])
            # The first one started the slow tier's engines: with its timing done, it is what a reserve must hold.
            last = max(self.reserve / self.confirmations, self.clock() - on_clock)  # a fast failure says nothing
            # The record is this machine's: a confirmation on a cluster's worker (`pool`) says nothing of it.
            if i == 0 and self.pool is None and any(stage == "slow" for stage, _ in slow_verdict.stages):
                record_confirmation(self.config.confirmation_key, time.monotonic() - started)
            if slow_verdict.accepted:
                break

    def _confirm_one(self, slow: Evaluator | Confirmer, cand: Candidate) -> Verdict:
        """Time `cand` on the whole model against the baseline; record it and tell the agents."""
        self._show(f"confirming {cand.id} on the whole model")
        verdict = slow.evaluate(cand, self.baseline)
        self.slow_verdicts[cand.id] = verdict
        record = self.store.record_verdict(self.run_id, verdict.to_dict(), tier="slow")
        for a in self.agents:
            a.observe([record])
        self.emit(verdict_line("slow", cand.manifest.author, cand.manifest.description, verdict))
        return verdict

    def _confirm_layouts(self, slow: Evaluator | Confirmer, deadline: float) -> None:
        """Confirm the best forward so far in each of `CompileConfig.layouts` (`athanor.loop.layouts`): the winner,
        else the baseline, and the reference forward where that one cannot run in the layout."""
        best = self.sources[self.winner_id() or self.baseline.id]
        for layout in self.config.layouts:
            for base in dict.fromkeys((best, self.reference)):
                if self.clock() >= deadline:
                    self.emit(f"layout {layout}: the budget is spent before its confirmation (not judged)")
                    return
                cand = in_layout(base, layout)
                if cand.id in self.slow_verdicts:  # confirmed before this --resume
                    break
                self._register(cand)
                verdict = self._confirm_one(slow, cand)
                if verdict.stage not in ("static", "smoke", "correctness"):  # it runs in the layout: judged
                    break

    @property
    def confirmations(self) -> int:
        """Confirmations the reserve holds: the best candidate's, and one per layout it is confirmed in."""
        return 1 + len(self.config.layouts)

    def _context(self) -> AgentContext:
        incumbent = self.winner_id() or self.baseline.id
        source = self.sources[incumbent].source
        return AgentContext(
            run_id=self.run_id, incumbent_id=incumbent, incumbent_source=source,
            leaderboard=tuple(self.store.leaderboard(self.run_id, 10)),
            recent_verdicts=tuple(self.store.recent_verdicts(self.run_id, 8)),
            posts=self.board.recent(20), model_summary=model_summary(self.spec, self.config),
            traffic_summary=self.profile.summary(),
        )

    def _show(self, doing: str) -> None:
        """Tell the status hook where the session stands, now that it does `doing`."""
        # A candidate's latest figure: the slow tier's (the whole model) where it was confirmed, else the fast's.
        latest = {**{i: ("fast", v) for i, v in self.fast_verdicts.items()},
                  **{i: ("slow", v) for i, v in self.slow_verdicts.items()}}
        timed = [(tier, v) for tier, v in latest.values() if v.status != "error" and not math.isnan(v.speedup.median)]
        best = max(timed, key=lambda tv: tv[1].speedup.median, default=None)
        self.status(SessionStatus(
            budget_s=self.config.budget_s, used_s=self.clock() - self._budget_start, screened=self.screened,
            confirmed=len(self.slow_verdicts), doing=doing, best_id=best[1].candidate_id if best else "",
            best_tier=best[0] if best else "", best=best[1].speedup if best else Speedup()))

    # -- results ------------------------------------------------------------------------------
    def winner_id(self) -> str | None:
        """The slow-tier-accepted candidate with the lowest projected cost (None before any)."""
        accepted = [v for v in self.slow_verdicts.values() if v.accepted]
        return min(accepted, key=lambda v: v.gpu_s_per_1k_requests).candidate_id if accepted else None

    def evaluations(self) -> list[EvaluationRecord]:
        return self.store.evaluations(self.run_id)


def compile_session(config: CompileConfig, on_event: Events = log.info, *, clock: Clock = time.monotonic,
                    max_candidates: int | None = None, status: StatusHook = no_status) -> CompileReport:
    """Run one compile session (see the module docstring) and write its report and winner.

    `clock` is what the budget is measured on; `max_candidates` stops the search after that many proposals are
    screened (None: the budget, or agents with nothing left to propose, stop it); `status` is told where the
    session stands as it goes (`SessionStatus`), e.g. for a live status line."""
    check_budget(config)
    return Session(config, on_event, clock=clock, max_candidates=max_candidates, status=status).run()
