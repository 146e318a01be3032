"""The admin API (`/admin/...`, bearer token): deploy a candidate directory through a canary; history.

`POST /admin/deploy {"candidate_dir": DIR}` answers 202 with the new deployment; its phase then moves
building -> shadow -> live -> deployed (or rolled_back / failed), visible at `GET /admin/deployments`
and `GET /admin/deployments/{id}`. Each deployment is recorded in the store when the server has one
(`athanor.store.Store.add_deployment` / `update_deployment`). `GET /admin/current` says what is served
now and from which directory, so that `athanor watch` can compile against it (`current_candidate`).
"""

from __future__ import annotations

import hmac
import logging
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

from athanor.engine.candidate_dir import load_candidate_dir
from athanor.errors import ConfigError
from athanor.serve.api import APIError
from athanor.serve.messages import DeploymentState

log = logging.getLogger(__name__)

STORE_STATUS = {"deployed": "live", "rolled_back": "rolled_back", "failed": "failed"}
"""Store status of a finished deploy, by its final phase."""


class DeploymentRecorder(Protocol):
    """What the admin API needs of the store (`athanor.store.Store` has it)."""

    def add_deployment(self, candidate_id: str, target: str, status: str, *, reason: str = "",
                       run_id: str | None = None, details: Any = None) -> Any: ...

    def update_deployment(self, deployment_id: int, status: str, *, reason: str = "",
                          details: Any = None) -> Any: ...


@dataclass(frozen=True)
class Deployment:
    id: int
    candidate_id: str
    candidate_dir: str
    incumbent_id: str
    phase: str = "pending"
    reason: str = ""
    figures: dict[str, float] = field(default_factory=dict)
    created_at: float = 0.0
    updated_at: float = 0.0
    phases: tuple[tuple[str, float], ...] = ()
    """Each phase the canary entered and when (Unix seconds)."""

    @property
    def finished(self) -> bool:
        return self.phase in ("deployed", "rolled_back", "failed")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class DeploymentBook:
    """Deployments of this server, newest last; mirrored into the store when there is one."""

    def __init__(self, recorder: DeploymentRecorder | None, target: str) -> None:
        self.recorder = recorder
        self.target = target
        self._items: dict[int, Deployment] = {}
        self._next = 1

    def in_progress(self) -> Deployment | None:
        return next((d for d in self._items.values() if not d.finished), None)

    def open(self, candidate_id: str, candidate_dir: str, incumbent_id: str) -> Deployment:
        now = time.time()
        key = self._next
        if self.recorder is not None:
            rec = self.recorder.add_deployment(candidate_id, self.target, "canary",
                                               details={"candidate_dir": candidate_dir, "incumbent": incumbent_id})
            key = int(rec.id)
        self._next = max(self._next, key) + 1
        dep = Deployment(key, candidate_id, candidate_dir, incumbent_id, "pending", "", {}, now, now, (("pending", now),))
        self._items[key] = dep
        return dep

    def update(self, state: DeploymentState) -> Deployment | None:
        """Apply a worker's report; returns the deployment when it just finished."""
        if state.deploy_id < 0:  # the worker died: whatever was in flight failed with it
            dep = self.in_progress()
            if dep is None:
                return None
            state = replace(state, deploy_id=dep.id, phase="failed", candidate_id=dep.candidate_id,
                            incumbent_id=dep.incumbent_id)
        dep = self._items.get(state.deploy_id)
        if dep is None or dep.finished:
            return None
        now = time.time()
        moved = state.phase != dep.phase
        dep = replace(dep, phase=state.phase, reason=state.reason, figures=dict(state.figures), updated_at=now,
                      phases=(*dep.phases, (state.phase, now)) if moved else dep.phases)
        self._items[dep.id] = dep
        if moved:
            self._record(dep)
        if not dep.finished:
            return None
        log.info("deployment %d of %s: %s %s", dep.id, dep.candidate_id, dep.phase, dep.reason)
        return dep

    def _record(self, dep: Deployment) -> None:
        """Mirror a phase change into the store: its status, and the canary's phases and comparisons so far."""
        if self.recorder is None:
            return
        details = {"phases": [{"phase": p, "at": at} for p, at in dep.phases], "figures": dep.figures}
        try:
            self.recorder.update_deployment(dep.id, STORE_STATUS.get(dep.phase, "canary"), reason=dep.reason,
                                            details=details)
        except Exception as e:  # the store being away must not take the server down
            log.warning("could not record deployment %d in the store: %s", dep.id, e)

    def get(self, key: int) -> Deployment | None:
        return self._items.get(key)

    def all(self) -> list[Deployment]:
        return [self._items[k] for k in sorted(self._items)]


def current_candidate(active_id: str, candidate_dir: str) -> dict[str, Any]:
    """`GET /admin/current`: the id of the candidate serving now and the directory it was loaded from.

    `candidate_dir` is None when the server serves the built-in reference forward: it was started
    without `--candidate` and nothing was deployed since, or the directory's candidate did not build
    (the worker then falls back to the reference), or the directory no longer holds that candidate.
    """
    directory: str | None = None
    if candidate_dir:
        try:
            if load_candidate_dir(candidate_dir).id == active_id:
                directory = str(Path(candidate_dir).resolve())  # the server's cwd means nothing to a client
        except ConfigError as e:
            log.warning("the served candidate's directory %s no longer loads: %s", candidate_dir, e)
    return {"object": "candidate", "candidate_id": active_id, "candidate_dir": directory}


def bearer_is(expected: str, authorization: str) -> bool:
    """Whether an Authorization header is `Bearer <expected>` (compared in constant time)."""
    scheme, _, token = authorization.partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(token.strip().encode(), expected.encode())


def check_key(expected: str, authorization: str | None) -> None:
    """An APIError unless `authorization` carries the server's --api-key."""
    if not bearer_is(expected, authorization or ""):
        raise APIError(401, "invalid or missing API key: send 'Authorization: Bearer <key>'",
                       type="authentication_error", code="invalid_api_key")


def check_token(expected: str, authorization: str | None) -> None:
    """An APIError unless `authorization` is `Bearer <expected>` (compared in constant time)."""
    if not expected:
        raise APIError(403, "the admin API is disabled: start the server with --admin-token-file",
                       type="permission_error", code="admin_disabled")
    if not authorization:
        raise APIError(401, "missing bearer token: send 'Authorization: Bearer <admin token>'",
                       type="authentication_error", code="missing_token")
    if not bearer_is(expected, authorization):
        raise APIError(401, "invalid admin token", type="authentication_error", code="invalid_token")
