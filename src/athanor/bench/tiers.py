"""`athanor bench tiers`: does the fast tier's ranking predict the whole model's, and how many more candidates does
screening on it evaluate in the same time?

Candidates come from the variant agent (the best-known options first, then Optuna's TPE over the moves, told
every fast-tier verdict as in a compile session). Each is evaluated against the reference on the fast tier and on
the slow tier with the evaluators `athanor compile` builds for the device, and every verdict is kept in a store
in the run directory; the figures are `tier_figures`'.

`slow_first` N evaluates only the first N candidates on both tiers and the rest on the fast tier: the correlation
and the misses are figures of the first N, and the equal-budget replay needs the slow-tier verdicts of only the
candidates it reaches; those past N that it confirms are evaluated on the slow tier after the others (it replays
again after each). A run longer than one sitting is split: `run_dir` keeps the store (and each call's measured
engine starts), `time_limit` starts no candidate after that many seconds, `resume` continues the run (its rows
rebuilt from the store, the agent warm-started on their fast-tier verdicts), and each call's record holds all
rows so far. `devices` runs one lane per GPU, each with its own engines; the lanes share the agent and the store.
"""

from __future__ import annotations

import dataclasses
import logging
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from athanor.bench import tier_figures as tf
from athanor.bench.record import provenance
from athanor.errors import ConfigError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TiersOptions:
    model: str = "smollm2-135m"
    devices: tuple[str, ...] = ("cpu",)
    """One lane per device, each named once (lanes on one device would wait for its lock inside their timing)."""
    dtype: str = ""
    traffic: str = "preset:chat"
    candidates: int = 30
    slow_first: int = -1
    """Evaluate only the first N candidates on the slow tier too (and later ones the replay confirms); -1: all."""
    budget_s: float = 480.0
    """Seconds of the equal-budget comparison."""
    max_seqs: int = 0
    max_seq_len: int = 0
    seed: int = 0
    run_dir: str = ""
    """Where the store is kept (default: a temporary directory)."""
    resume: bool = False
    report_only: bool = False
    """Only the figures of the run in `run_dir`; nothing is evaluated."""
    time_limit_s: float = 0.0
    """Start no candidate after this many seconds (0: no limit)."""


def _rows_so_far(store: Any, run_id: str, slow_first: int) -> tuple[list[dict[str, Any]], list[tuple[str, Any]]]:
    """Rows of the candidates done (on both tiers, or on the fast tier past the first `slow_first`), in proposal
    order, and the fast-tier history (source, record) that warm-starts the variant agent."""
    rows, history = [], []
    for i, cand in enumerate(c for c in store.candidates(run_id) if c.author != "reference"):
        evs = {ev.tier: ev for ev in store.evaluations(run_id, candidate_id=cand.id)}
        if "fast" in evs:
            history.append((cand.source, evs["fast"]))
        if "fast" in evs and ("slow" in evs or i >= slow_first):
            rows.append(tf.row(cand.id, cand.description, evs["fast"], evs.get("slow")))
    return rows, history


def bench_tiers(o: TiersOptions) -> dict[str, Any]:
    """Run (or resume, or report) the tier benchmark; the record of all rows so far."""
    from athanor.agents.variant import VariantConfig, VariantSearch
    from athanor.engine.candidate import baseline_candidate
    from athanor.loop.config import CompileConfig
    from athanor.model.registry import load_spec
    from athanor.store import open_store

    if (o.resume or o.report_only) and not o.run_dir:
        raise ConfigError("--resume and --report need --run-dir")
    if not o.devices or len(set(o.devices)) != len(o.devices):
        raise ConfigError(f"--devices {','.join(o.devices)}: one lane per device, each named once")
    slow_first = o.candidates if o.slow_first < 0 else o.slow_first

    def compile_config(device: str) -> CompileConfig:
        return CompileConfig(model=o.model, traffic=o.traffic, device=device, dtype=o.dtype, max_seqs=o.max_seqs,
                             max_seq_len=o.max_seq_len, seed=o.seed, budget_s=o.budget_s)

    config = compile_config(o.devices[0])
    agent = VariantSearch(VariantConfig(device="cpu" if config.on_cpu else "cuda",
                                        moe=load_spec(o.model).moe is not None, seed=o.seed))
    reference = baseline_candidate()
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="athanor-tiers-") as tmp:
        run_dir = Path(o.run_dir or tmp)
        run_dir.mkdir(parents=True, exist_ok=True)
        store = open_store(run_dir)
        runs = store.runs(limit=1)
        if o.resume or o.report_only:
            if not runs:
                raise ConfigError(f"--run-dir {o.run_dir} holds no run")
            run = store.resume_run(runs[0].id) if o.resume else runs[0]
            rows, history = _rows_so_far(store, run.id, slow_first)
            agent.warm_start(history)
            log.info("run %s: %d candidates done", run.id, len(rows))
        else:
            if runs:
                raise ConfigError(f"--run-dir {o.run_dir} already holds run {runs[0].id}: pass --resume")
            run = store.add_run(o.model, o.traffic, o.devices[0], config={"benchmark": "tiers"})
            store.add_candidate(run.id, reference.source, author="reference")
            rows = []
        if not o.report_only:
            lanes = _Lanes(o, store, run.id, agent, reference, rows, slow_first, compile_config, run_dir, started)
            with ThreadPoolExecutor(len(o.devices)) as pool:
                for done in [pool.submit(lanes.lane, d) for d in o.devices]:
                    done.result()
        order = {c.id: i for i, c in enumerate(store.candidates(run.id))}
        rows.sort(key=lambda r: order[r["candidate_id"]])  # lanes finish out of order; the replay wants proposals'
        if not o.report_only and len(rows) >= o.candidates:
            _confirm_for_replay(o, store, run.id, reference, rows, config, run_dir)
        startup = tf.startup_figures(run_dir)
    return {"benchmark": "tiers", "model": o.model, "lanes": list(o.devices), "traffic": o.traffic,
            **provenance(o.devices[0]), "fast_layers": config.evaluate_config("fast").fast_layers,
            "max_seqs": config.evaluate_config("slow").max_seqs,
            "call_wall_s": time.perf_counter() - started,  # this call's; a resumed run spans several
            "slow_first": slow_first,
            "evaluations_s": sum(r["fast_wall_s"] + (r["slow_wall_s"] if tf.on_slow(r) else 0.0) for r in rows),
            "candidates": rows, **tf.figures(rows),
            "equal_budget": tf.equal_budget(rows, o.budget_s, tf.replay_reserve(rows, config, startup), startup),
            # what a first run on a machine keeps (no confirmation recorded yet)
            "equal_budget_default_reserve": tf.equal_budget(rows, o.budget_s, config.reserve_s(), startup)}


@dataclass
class _Lanes:
    """What the lanes share: the agent, the store and the rows, behind one lock."""

    o: TiersOptions
    store: Any
    run_id: str
    agent: Any
    reference: Any
    rows: list[dict[str, Any]]
    slow_first: int
    compile_config: Any
    run_dir: Path
    started: float
    in_flight: int = 0
    lock: threading.Lock = dataclasses.field(default_factory=threading.Lock)

    def lane(self, device: str) -> None:
        """Propose, screen and confirm candidates one after the other on `device` (its own engines)."""
        from athanor.agents.base import AgentContext
        from athanor.engine.candidate import Candidate
        from athanor.evaluate import Evaluator

        config = self.compile_config(device)
        with Evaluator(config.evaluate_config("fast")) as fast, Evaluator(config.evaluate_config("slow")) as slow:
            # Each tier's engines start before its first evaluation and are timed apart: a run pays them once (the
            # replay charges them so), not once per call of a run split into several.
            t0 = time.perf_counter()
            fast.engines("fast")
            t1 = time.perf_counter()
            slow.engines("slow")
            with self.lock:
                tf.record_startup(self.run_dir, device, t1 - t0, time.perf_counter() - t1)
            while True:
                with self.lock:
                    if len(self.rows) + self.in_flight >= self.o.candidates:
                        return
                    if self.o.time_limit_s and time.perf_counter() - self.started > self.o.time_limit_s:
                        log.warning("%s: --time-limit %.0f s reached: resume to go on", device, self.o.time_limit_s)
                        return
                    proposals = self.agent.propose(AgentContext(run_id=self.run_id, incumbent_id=self.reference.id,
                                                                incumbent_source=self.reference.source))
                    if not proposals:
                        log.warning("the variant agent has nothing new to propose")
                        return
                    p = proposals[0]
                    both = sum(c.author != "reference" for c in self.store.candidates(self.run_id)) < self.slow_first
                    cand = Candidate.from_source(p.source, parent=p.parent_id, author=p.author,
                                                 description=p.description)
                    self.store.add_candidate(self.run_id, cand.source, parent_id=p.parent_id, author=p.author,
                                             description=p.description)
                    self.in_flight += 1
                fast_verdict = fast.evaluate(cand, self.reference).to_dict()
                with self.lock:
                    fast_record = self.store.record_verdict(self.run_id, fast_verdict, tier="fast")
                    self.agent.observe([fast_record])
                slow_verdict = slow.evaluate(cand, self.reference).to_dict() if both else None
                with self.lock:
                    slow_record = self.store.record_verdict(self.run_id, slow_verdict, tier="slow") \
                        if slow_verdict else None
                    self.in_flight -= 1
                    self.rows.append(tf.row(cand.id, p.description, fast_record, slow_record))
                    log.info("%3d %s %s", len(self.rows), device, tf.line(self.rows[-1]))


def _confirm_for_replay(o: TiersOptions, store: Any, run_id: str, reference: Any, rows: list[dict[str, Any]],
                        config: Any, run_dir: Path) -> None:
    """Evaluate on the slow tier the candidates past `slow_first` that the replay confirms."""
    from athanor.engine.candidate import Candidate
    from athanor.evaluate import Evaluator

    startup = tf.startup_figures(run_dir)  # the lanes have recorded theirs; confirming adds none
    replay = tf.equal_budget(rows, o.budget_s, tf.replay_reserve(rows, config, startup), startup)
    if not replay["needs_slow"]:
        return
    with Evaluator(config.evaluate_config("slow")) as slow:
        slow.engines("slow")  # started outside the evaluations' wall times, as in the lanes
        while replay["needs_slow"]:
            cid = replay["needs_slow"][0]
            cand = store.get_candidate(run_id, cid)
            assert cand is not None  # the replay names candidates of this run
            verdict = slow.evaluate(Candidate.from_source(cand.source, parent=cand.parent_id, author=cand.author,
                                                          description=cand.description), reference)
            record = store.record_verdict(run_id, verdict.to_dict(), tier="slow")
            k = next(i for i, r in enumerate(rows) if r["candidate_id"] == cid)
            fast_record = next(ev for ev in store.evaluations(run_id, candidate_id=cid) if ev.tier == "fast")
            rows[k] = tf.row(cid, cand.description, fast_record, record)
            log.info("confirmed for the replay: %s", tf.line(rows[k]))
            replay = tf.equal_budget(rows, o.budget_s, tf.replay_reserve(rows, config, startup), startup)


def summary_lines(record: dict[str, Any]) -> list[str]:
    """The correlation, the misses and the equal-budget comparison."""
    eb, default = record["equal_budget"], record["equal_budget_default_reserve"]
    return [f"{len(record['candidates'])} candidates, {record['on_both']} on both tiers, "
            f"{record['timed_on_both']} timed on both",
            f"Spearman fast vs slow: {record['spearman']:.3f}",
            f"fast-tier misses: {len(record['misses'])}; the slow tier's best missed: {record['slow_best_missed']}",
            f"{eb['budget_s']:.0f} s: fast+slow screens {eb['fast_slow']['screened']} (winner x"
            f"{eb['fast_slow']['winner_slow_speedup'] or float('nan'):.3f}), slow only evaluates "
            f"{eb['slow_only']['evaluated']} (winner x{eb['slow_only']['winner_slow_speedup'] or float('nan'):.3f}): "
            f"{eb['screened_ratio']:.1f}x; {eb['reserve_s']:.0f} s kept to confirm (with the default "
            f"{default['reserve_s']:.0f} s: {default['screened_ratio']:.1f}x)"]
