"""`athanor watch`: follow the request log, and on drift recompile for the new traffic and deploy the winner.

The continuous part of the loop (docs/architecture.md, "The loop"): windows of the server's request log (by its
timestamps) become `TrafficProfile`s; `athanor.traffic.DriftMonitor` judges each against the
reference; when a change warrants a recompile, the watch asks the server what it serves
(`GET /admin/current`), `athanor.loop.compile_session` compiles for the new window's profile against
that candidate (the session's incumbent; the reference forward competes too), and a winner, which
beat what is served, goes to the server's admin API (`POST /admin/deploy`), whose canary decides.
The watch and the server share a file system: candidate directories travel as paths. One status
line per event. Everything needed to go on — the log offset, the open window,
the reference profile, the drift streak and an interrupted recompile — is kept in a JSON state file
after every event, so a restarted watch neither re-reads old traffic nor forgets a pending deploy.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from athanor.errors import ConfigError
from athanor.loop.config import CompileConfig
from athanor.loop.fleet import roll_out, served_candidate
from athanor.loop.session import compile_session
from athanor.store import open_store
from athanor.traffic import DriftMonitor, RequestChunk, TrafficProfile, profile_chunks
from athanor.traffic.drift import DriftReport
from athanor.traffic.profile import DEFAULT_TPOT_S, parse_window

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class WatchOptions:
    model: str
    log: str
    """The server's request log (JSONL; `athanor` or Mooncake records)."""
    server: str
    """The server's base URL: what it serves is the incumbent a recompile must beat, and its admin API deploys the
    winner."""
    fleet: tuple[str, ...] = ()
    """More servers the winner is rolled out to after `server`, one canary at a time (`athanor.loop.fleet`)."""
    admin_token: str = ""
    budget: str = "10m"
    """Time budget of each compile session."""
    window: str = "60s"
    """Traffic window (log time) that becomes one profile."""
    state: str = ""
    """State file; empty: LOG.watch.json beside the log."""
    workdir: str = ""
    """Where compile sessions write (one directory per recompile); empty: beside the state file."""
    device: str = "cpu"
    follow: bool = True
    """Keep following the log; False: stop at its end (scripts, tests)."""
    poll_s: float = 1.0
    persistence: int = 2
    """Consecutive windows a recompile-worthy change must last (see `DriftMonitor`)."""
    deploy_timeout_s: float = 600.0
    store: str = ""
    """An experiment store (path or URL) the watch records each window's profile and drift in, and what a
    recompile led to (the dashboard's traffic page); empty: none."""


@dataclass
class WatchState:
    """What survives a restart."""

    offset: int = 0
    window_start: float | None = None
    rows: list[list[float]] = field(default_factory=list)
    reference: dict[str, Any] | None = None
    streak: int = 0
    windows: int = 0
    recompiles: int = 0
    deployments: list[dict[str, Any]] = field(default_factory=list)
    pending: dict[str, Any] | None = None
    """A recompile that was warranted but has not deployed yet: {"profile": ..., "index": n}."""

    @classmethod
    def load(cls, path: Path) -> WatchState:
        if not path.is_file():
            return cls()
        try:
            raw = json.loads(path.read_text())
        except json.JSONDecodeError as e:
            raise ConfigError(f"{path}: the watch state is not valid JSON ({e.msg}); move it away to start afresh") from None
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in raw.items() if k in names})

    def save(self, path: Path) -> None:
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(dataclasses.asdict(self)))
        os.replace(tmp, path)  # atomic: a crash leaves the old state or the new one


def _row(rec: dict[str, Any]) -> tuple[float, int, int]:
    if "ttft_s" in rec or "latency_s" in rec:  # athanor's own log: Unix seconds
        return float(rec["timestamp"]), int(rec["input_length"]), int(rec["output_length"])
    return float(rec["timestamp"]) / 1000.0, int(rec["input_length"]), int(rec["output_length"])  # Mooncake: ms


def _profile(rows: list[list[float]], source: str) -> TrafficProfile:
    a = np.asarray(rows, dtype=np.float64)
    chunk = RequestChunk(a[:, 0], a[:, 1].astype(np.int64), a[:, 2].astype(np.int64))
    return profile_chunks([chunk], source, tpot_s=DEFAULT_TPOT_S)


class Watcher:
    def __init__(self, options: WatchOptions) -> None:
        self.options = options
        self.log_path = Path(options.log)
        self.state_path = Path(options.state) if options.state else self.log_path.with_name(
            self.log_path.name + ".watch.json")
        self.workdir = Path(options.workdir) if options.workdir else self.state_path.with_name(
            self.state_path.stem + ".sessions")
        self.window_s = parse_window(options.window)
        self.budget_s = parse_window(options.budget)
        self.state = WatchState.load(self.state_path)
        reference = TrafficProfile.from_dict(self.state.reference) if self.state.reference else None
        self.monitor = DriftMonitor(reference=reference, persistence=options.persistence,
                                    num_recompiles=self.state.recompiles, streak=self.state.streak)
        self.store = open_store(options.store) if options.store else None
        self._snapshot: int | None = None
        """The store's row for the window being acted on (a recompile's outcome goes into it)."""

    def _save(self) -> None:
        s = self.state
        s.reference = self.monitor.reference.to_dict() if self.monitor.reference is not None else None
        s.streak = self.monitor.streak
        s.recompiles = self.monitor.num_recompiles
        s.save(self.state_path)

    def run(self) -> Iterator[str]:
        if not self.log_path.exists():
            raise ConfigError(f"--log {self.log_path}: no such file; point it at the server's request log (--log)")
        yield (f"watch: {self.log_path} from byte {self.state.offset}, windows of {self.options.window}, "
               f"{self.state.windows} windows and {self.state.recompiles} recompiles so far")
        if self.state.pending is not None:
            yield from self._recompile(TrafficProfile.from_dict(self.state.pending["profile"]))
        buf = ""
        while True:
            with open(self.log_path, encoding="utf-8") as f:
                f.seek(self.state.offset)
                data = f.read()
            buf += data
            *lines, buf = buf.split("\n")
            consumed = self.state.offset + len(data.encode()) - len(buf.encode())
            for line in lines:
                yield from self._line(line)
            self.state.offset = consumed
            buf = ""
            self._save()
            if not data:
                if not self.options.follow:
                    return
                time.sleep(self.options.poll_s)

    def _line(self, line: str) -> Iterator[str]:
        if not line.strip():
            return
        try:
            t, n_in, n_out = _row(json.loads(line))
        except (ValueError, KeyError, TypeError) as e:
            log.warning("%s: skipped a malformed line (%s)", self.log_path, e)
            return
        s = self.state
        if s.window_start is None:
            s.window_start = t
        while t >= s.window_start + self.window_s:
            if s.rows:
                yield from self._window(s.window_start)
            s.rows, s.window_start = [], s.window_start + self.window_s
        s.rows.append([t, n_in, n_out])

    def _window(self, start: float) -> Iterator[str]:
        s = self.state
        s.windows += 1
        profile = _profile(s.rows, f"{self.log_path.name}@{start:.0f}")
        report = self.monitor.observe(profile)
        self._record(profile, report)
        if report is None:
            yield f"window {s.windows}: {len(s.rows)} requests; the reference traffic"
        elif not report.recompile:
            moved = ", ".join(report.moved()) or "nothing moved"
            yield f"window {s.windows}: {len(s.rows)} requests; {moved}" + (f" ({report.note})" if report.note else "")
        else:
            yield f"window {s.windows}: {len(s.rows)} requests; drift warrants a recompile: {', '.join(report.moved())}"
            s.pending = {"profile": profile.to_dict()}
            self._save()
            yield from self._recompile(profile)

    def _recompile(self, profile: TrafficProfile) -> Iterator[str]:
        served_id, served_dir = served_candidate(self.options.server, self.options.admin_token)
        index = len(list(self.workdir.glob("session-*"))) + 1 if self.workdir.exists() else 1
        out = self.workdir / f"session-{index:03d}"
        out.mkdir(parents=True, exist_ok=True)
        traffic = out / "traffic.json"
        traffic.write_text(profile.to_json(indent=1))
        against = (f"the served candidate {served_id} ({served_dir})" if served_dir
                   else f"the served reference forward ({served_id})")
        yield (f"recompile {index}: compiling {self.options.model} for the new traffic ({self.options.budget}) "
               f"against {against} -> {out}")
        self._outcome({"recompile": {"session": str(out), "against": served_id, "status": "compiling"}})
        winner = compile_winner(self.options.model, traffic, self.budget_s, self.options.device, out,
                                incumbent=served_dir)
        if winner is None:
            yield f"recompile {index}: nothing was confirmed faster than {against}; the server keeps it"
            self._outcome({"recompile": {"session": str(out), "against": served_id, "status": "no winner"}})
        else:
            servers = [self.options.server, *self.options.fleet]
            yield f"recompile {index}: winner {winner}; deploying to {', '.join(servers)}"
            lines: list[str] = []
            rollout = roll_out(servers, self.options.admin_token, winner, self.options.deploy_timeout_s, self.store,
                               lines.append)
            dep = rollout.outcomes[0].deployment
            self.state.deployments.append(dep)
            self._outcome({"recompile": {"session": str(out), "against": served_id, "status": "deployed",
                                         "winner": dep.get("candidate_id"), "deployment": dep,
                                         "rollout": rollout.status, "reason": rollout.reason}})
            if self.options.fleet:
                yield from lines
            yield f"deploy {dep.get('id')}: {dep.get('candidate_id')} {dep.get('phase')} {dep.get('reason', '')}".rstrip()
        self.state.pending = None
        self._save()

    def _record(self, profile: TrafficProfile, report: DriftReport | None) -> None:
        """The window's profile and its drift against the reference, in the store when there is one."""
        if self.store is None:
            return
        drift = {} if report is None else {**report.to_dict(), "moved": report.moved()}
        self._snapshot = self.store.add_traffic_snapshot(f"watch:{profile.source}", profile.to_dict(),
                                                         drift=drift).id

    def _outcome(self, what: dict[str, Any]) -> None:
        """What the last recorded window led to, added to its row."""
        if self.store is not None and self._snapshot is not None:
            self.store.update_traffic_snapshot(self._snapshot, what)


def compile_winner(model: str, traffic: Path, budget_s: float, device: str, out: Path,
                   incumbent: Path | None = None) -> Path | None:
    """Run one compile session for `traffic`, timed against `incumbent` (a candidate directory; None: the
    reference forward); the deployable winner directory, or None when nothing was confirmed faster."""
    compile_session(CompileConfig(model=model, traffic=str(traffic), budget_s=budget_s, device=device, out_dir=out,
                                  incumbent=incumbent))
    winner = out / "winner"
    return winner if (winner / "candidate.py").is_file() else None


def watch(options: WatchOptions) -> Iterator[str]:
    """Status lines, one per event, until the log ends (with `follow=False`) or forever."""
    return Watcher(options).run()
