"""Deploying a verified winner to servers through their admin API: one server, or a fleet one canary at a time.

`deploy` hands a candidate directory to one server (`POST /admin/deploy`) and waits for its canary's outcome.
`roll_out` takes the servers in order: each must deploy the candidate before the next is touched, so at most one
server is ever in a canary. The first server whose deploy does not end "deployed" stops the rollout, and every server
that had taken the candidate is rolled back, newest first, by deploying what it served before (its candidate
directory, or the reference forward it started with) through its own canary. Each server's deployment, and each
rollback, is recorded in the experiment store when one is given. The servers and this process share a file system:
candidate directories travel as paths.
"""

from __future__ import annotations

import logging
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx

from athanor.errors import ConfigError
from athanor.serve.admin import STORE_STATUS

if TYPE_CHECKING:
    from athanor.store import Store

log = logging.getLogger(__name__)


def served_candidate(server: str, token: str) -> tuple[str, Path | None]:
    """What the server serves now (`GET /admin/current`): its candidate id, and the directory it was
    loaded from (None: the built-in reference forward)."""
    try:
        r = httpx.get(f"{server}/admin/current", headers={"Authorization": f"Bearer {token}"}, timeout=30)
    except httpx.HTTPError as e:
        raise ConfigError(f"--server {server}: cannot ask what it serves ({e}); is the server up?") from None
    if r.status_code != 200:
        raise ConfigError(f"--server {server}: GET /admin/current answered HTTP {r.status_code}: {r.text[:300]}")
    body = r.json()
    directory = body.get("candidate_dir")
    if directory and not Path(directory).is_dir():
        raise ConfigError(f"--server {server}: it serves {body['candidate_id']} from {directory}, which this "
                          "machine cannot read; run this where the server's candidate directories are")
    return str(body["candidate_id"]), Path(directory) if directory else None


def deploy(server: str, token: str, candidate_dir: Path, timeout_s: float) -> dict[str, Any]:
    """Deploy through the admin API and wait for the canary's outcome; the final deployment record."""
    headers = {"Authorization": f"Bearer {token}"}
    try:
        with httpx.Client(base_url=server, headers=headers, timeout=30) as client:
            r = client.post("/admin/deploy", json={"candidate_dir": str(candidate_dir.resolve())})
            if r.status_code != 202:
                return {"phase": "failed", "reason": f"HTTP {r.status_code}: {r.text[:500]}", "candidate_id": ""}
            dep: dict[str, Any] = r.json()["deployment"]
            deadline = time.monotonic() + timeout_s
            while dep["phase"] not in ("deployed", "rolled_back", "failed") and time.monotonic() < deadline:
                time.sleep(0.5)
                dep = client.get(f"/admin/deployments/{dep['id']}").json()["deployment"]
    except httpx.HTTPError as e:
        return {"phase": "failed", "reason": f"{server} did not answer: {e}", "candidate_id": ""}
    if dep["phase"] not in STORE_STATUS:
        dep = {**dep, "phase": "failed", "reason": f"no outcome within {timeout_s:.0f} s (last phase {dep['phase']})"}
    return dep


@dataclass(frozen=True)
class ServerOutcome:
    server: str
    deployment: dict[str, Any]
    """The server's record of the candidate's deploy (its final phase and reason)."""
    rollback: dict[str, Any] | None = None
    """Where the rollout stopped later: the server's record of what it served before, deployed again."""


@dataclass(frozen=True)
class Rollout:
    candidate_dir: str
    status: str
    """"deployed" (every server took it) or "stopped"."""
    reason: str = ""
    outcomes: list[ServerOutcome] = field(default_factory=list)


def roll_out(servers: list[str], token: str, candidate_dir: Path, timeout_s: float = 600.0,
             store: Store | None = None, say: Callable[[str], None] = log.info) -> Rollout:
    """Deploy `candidate_dir` to `servers` one canary at a time; at the first that does not deploy it, stop and roll
    back the ones that did (see the module docstring)."""
    if not servers:
        raise ConfigError("--server: name at least one server to deploy to")
    before = {server: served_candidate(server, token) for server in servers}  # every one reachable before any change
    outcomes: list[ServerOutcome] = []
    for server in servers:
        say(f"{server}: deploying {candidate_dir} (serving {before[server][0]})")
        dep = deploy(server, token, candidate_dir, timeout_s)
        _record(store, server, dep, f"fleet rollout of {candidate_dir}")
        say(f"{server}: {dep.get('candidate_id')} {dep['phase']} {_last_line(dep)}".rstrip())
        if dep["phase"] == "deployed":
            outcomes.append(ServerOutcome(server, dep))
            continue
        reason = f"{server}: {dep['phase']}: {_last_line(dep)}".rstrip(": ")
        rolled = [_roll_back(o, before[o.server], token, timeout_s, store, reason, say) for o in reversed(outcomes)]
        return Rollout(str(candidate_dir), "stopped", reason, [*reversed(rolled), ServerOutcome(server, dep)])
    return Rollout(str(candidate_dir), "deployed", "", outcomes)


def _roll_back(outcome: ServerOutcome, served: tuple[str, Path | None], token: str, timeout_s: float,
               store: Store | None, why: str, say: Callable[[str], None]) -> ServerOutcome:
    """Deploy to `outcome.server` what it served before the rollout: its directory, or the reference forward."""
    from athanor.engine.candidate import Candidate, reference_source
    from athanor.engine.candidate_dir import write_candidate_dir

    previous_id, previous_dir = served
    with tempfile.TemporaryDirectory(prefix="ath-rollback-") as tmp:
        if previous_dir is None:  # the server started on the reference forward: deploy that again
            previous_dir = write_candidate_dir(Candidate.from_source(reference_source(), author="athanor",
                                                                     description="the reference forward"),
                                               Path(tmp) / "reference")
        say(f"{outcome.server}: rolling back to {previous_id} ({why})")
        dep = deploy(outcome.server, token, previous_dir, timeout_s)
    _record(store, outcome.server, dep, f"fleet rollback: {why}")
    if store is not None and outcome.deployment.get("candidate_id"):
        store.add_deployment(outcome.deployment["candidate_id"], outcome.server, "rolled_back",
                             reason=f"fleet rollback: {why}")
    say(f"{outcome.server}: {dep.get('candidate_id')} {dep['phase']} {_last_line(dep)}".rstrip())
    return ServerOutcome(outcome.server, outcome.deployment, dep)


def _last_line(dep: dict[str, Any]) -> str:
    """A deployment's reason in one line: its last (a build's error ends a traceback)."""
    lines = str(dep.get("reason") or "").strip().splitlines()
    return lines[-1] if lines else ""


def _record(store: Store | None, server: str, dep: dict[str, Any], why: str) -> None:
    if store is None:
        return
    reason = f"{why}: {_last_line(dep)}".rstrip(": ")
    store.add_deployment(dep.get("candidate_id") or "unknown", server, STORE_STATUS.get(dep["phase"], "failed"),
                         reason=reason, details={"deployment": dep})
