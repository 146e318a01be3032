"""A compile session's run in its store: a new one, or the one `--resume` continues, checked to be the same
experiment (timed against the same incumbent, at the same precision), with what it holds so far."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

from athanor.engine.candidate import Candidate
from athanor.engine.candidate_dir import SOURCE_NAME, load_candidate_dir
from athanor.errors import ConfigError
from athanor.evaluate import Verdict
from athanor.loop.config import CompileConfig
from athanor.loop.status import precision_flags
from athanor.seams import declared_layout, layout_name
from athanor.store import Run, Store
from athanor.traffic import TrafficProfile

RUNS_READ = 10_000
"""Runs of a shared store looked through for a run directory's own (newest first)."""


def start_or_resume(store: Store, cfg: CompileConfig, profile: TrafficProfile, reference: Candidate,
                    incumbent: Candidate | None, emit: Callable[[str], None]) -> str:
    """The run's id: `cfg.resume` continues the store's last run, else a new one is added (refused where the store
    holds one already: one run directory, one run). The reference and the incumbent are its first candidates."""
    runs = runs_in(store, cfg.out_dir)
    timed_against = {"id": incumbent.id, "dir": str(cfg.incumbent)} if incumbent else None
    if cfg.resume:
        if not runs:
            raise ConfigError(f"--resume: {cfg.out_dir} holds no run to resume; drop --resume to start one")
        was = runs[0].config.get("incumbent")
        if (was or {}).get("id") != (timed_against or {}).get("id"):
            against = f"incumbent {was['id']} ({was['dir']})" if was else "the reference"
            raise ConfigError(f"--incumbent: run {runs[0].id} in {cfg.out_dir} was timed against {against}; "
                              "resume it with the same --incumbent or choose another --out")
        was_precision = runs[0].config.get("precision")  # absent in runs from before it was recorded
        if was_precision is not None and was_precision != cfg.precision:
            was_flags = precision_flags(was_precision)
            raise ConfigError(f"--resume: run {runs[0].id} in {cfg.out_dir} was compiled with {was_flags}, not "
                              f"{precision_flags(cfg.precision)}; resume it with {was_flags} or choose another "
                              "--out")
        run = store.resume_run(runs[0].id)
        emit(f"resuming run {run.id} ({len(store.evaluations(run.id))} evaluations so far)")
    else:
        if runs:
            raise ConfigError(f"--out {cfg.out_dir}: already holds run {runs[0].id}; pass --resume to continue "
                              "it or choose another --out")
        config = {"budget_s": cfg.budget_s, "agents": list(cfg.agents), "seed": cfg.seed, "precision": cfg.precision,
                  "out_dir": str(cfg.out_dir.resolve())}
        if timed_against:
            config["incumbent"] = timed_against
        run = store.add_run(cfg.model, cfg.traffic, cfg.device, config=config)
        store.add_traffic_snapshot(cfg.traffic, profile.to_dict(), run_id=run.id)
    store.add_candidate(run.id, reference.source, author="reference", description="the reference forward (baseline)")
    if incumbent is not None:
        m = incumbent.manifest
        store.add_candidate(run.id, incumbent.source, parent_id=m.parent[:16], author="incumbent",
                            description=f"the incumbent to beat ({m.author}: {m.description})",
                            manifest=dataclasses.asdict(m))
    return run.id


def runs_in(store: Store, out_dir: Path) -> list[Run]:
    """The runs of the run directory `out_dir`, newest first: a store shared by a team's runs (`--store`) holds
    others too; a run from before runs recorded their directory belongs to the store's own directory."""
    here = str(out_dir.resolve())
    return [run for run in store.runs(limit=RUNS_READ) if run.config.get("out_dir", here) == here]


def load_incumbent(directory: Path) -> Candidate:
    """The candidate directory to beat (`--incumbent`), checked before anything starts."""
    try:
        incumbent = load_candidate_dir(directory)
        layout = declared_layout(incumbent.source, f"{directory}")
    except ConfigError as e:
        raise ConfigError(f"--incumbent: {e}") from None
    if layout:
        raise ConfigError(f"--incumbent {directory}: its {SOURCE_NAME} declares LAYOUT = \"{layout_name(layout)}\", and "
                          "the evaluator times an incumbent on one device: drop that line to compile against the same "
                          "forward on one device")
    return incumbent


def stored_verdicts(store: Store, run_id: str, sources: dict[str, Candidate], fast: dict[str, Verdict],
                    slow: dict[str, Verdict]) -> list[tuple[str, Any]]:
    """Fill `sources` and each tier's verdicts from the run's evaluations so far (a resumed run's); the fast tier's
    (source, evaluation) pairs, the variant search's history."""
    history = []
    for ev in store.evaluations(run_id):
        record = store.get_candidate(run_id, ev.candidate_id)
        if record is None or not ev.figures:
            continue
        cand = Candidate.from_source(record.source, parent=record.parent_id, author=record.author,
                                     description=record.description)
        sources[cand.id] = cand
        (fast if ev.tier == "fast" else slow)[cand.id] = Verdict.from_dict(ev.figures)
        if ev.tier == "fast":
            history.append((record.source, ev))
    return history
