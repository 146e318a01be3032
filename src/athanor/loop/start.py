"""A compile session's run in its store: a new one, or the one `--resume` continues, checked to be the same
experiment (timed against the same incumbent, at the same precision)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from athanor.engine.candidate import Candidate
from athanor.errors import ConfigError
from athanor.loop.config import CompileConfig
from athanor.loop.status import precision_flags
from athanor.store import Store
from athanor.traffic import TrafficProfile


def start_or_resume(store: Store, cfg: CompileConfig, profile: TrafficProfile, reference: Candidate,
                    incumbent: Candidate | None, emit: Callable[[str], None]) -> str:
    """The run's id: `cfg.resume` continues the store's last run, else a new one is added (refused where the store
    holds one already: one run directory, one run). The reference and the incumbent are its first candidates."""
    runs = store.runs(limit=1)
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
        config = {"budget_s": cfg.budget_s, "agents": list(cfg.agents), "seed": cfg.seed, "precision": cfg.precision}
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
