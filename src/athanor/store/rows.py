"""Conversions between database rows and the records of `records.py`, and JSON hygiene.

JSON columns hold only what both SQLite and PostgreSQL's `json` accept: NaN and infinities become
null (PostgreSQL rejects them), tuples become lists. Float columns hold NULL for "not measured"
(SQLite would turn NaN into NULL anyway) and read back as nan.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from athanor.store.records import CandidateRecord, Deployment, EvaluationRecord, Post, Run, TrafficSnapshot


def plain(value: Any) -> Any:
    """A JSON-safe copy of `value`: non-finite floats become None, tuples lists, keys strings."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    return value


def nan_to_none(value: float | None) -> float | None:
    return None if value is None or not math.isfinite(value) else float(value)


def _float(value: Any) -> float:
    return math.nan if value is None else float(value)


def run_from_row(row: Mapping[Any, Any]) -> Run:
    return Run(id=row["id"], model=row["model"], traffic=row["traffic"], device=row["device"],
               status=row["status"], started_at=float(row["started_at"]),
               finished_at=None if row["finished_at"] is None else float(row["finished_at"]),
               config=dict(row["config"] or {}), summary=dict(row["summary"] or {}))


def candidate_from_row(row: Mapping[Any, Any]) -> CandidateRecord:
    return CandidateRecord(run_id=row["run_id"], id=row["id"], content_hash=row["content_hash"],
                           source=row["source"], parent_id=row["parent_id"], author=row["author"],
                           description=row["description"], manifest=dict(row["manifest"] or {}),
                           created_at=float(row["created_at"]))


def evaluation_from_row(row: Mapping[Any, Any]) -> EvaluationRecord:
    return EvaluationRecord(
        id=int(row["id"]), run_id=row["run_id"], candidate_id=row["candidate_id"],
        incumbent_id=row["incumbent_id"] or "", author=row.get("author") or "", tier=row["tier"],
        status=row["status"], accepted=bool(row["accepted"]), stage=row["stage"], reason=row["reason"],
        speedup=_float(row["speedup"]), speedup_ci_low=_float(row["speedup_ci_low"]),
        speedup_ci_high=_float(row["speedup_ci_high"]), gpu_s_per_1k=_float(row["gpu_s_per_1k"]),
        wall_s=float(row["wall_s"] or 0.0), shapes=tuple(row["shapes"] or ()), figures=dict(row["figures"] or {}),
        created_at=float(row["created_at"]))


def post_from_row(row: Mapping[Any, Any]) -> Post:
    return Post(id=int(row["id"]), run_id=row["run_id"], agent=row["agent"], kind=row["kind"], text=row["text"],
                candidate_id=row["candidate_id"], created_at=float(row["created_at"]))


def deployment_from_row(row: Mapping[Any, Any]) -> Deployment:
    return Deployment(id=int(row["id"]), run_id=row["run_id"], candidate_id=row["candidate_id"],
                      target=row["target"], status=row["status"], reason=row["reason"],
                      details=dict(row["details"] or {}), created_at=float(row["created_at"]),
                      updated_at=float(row["updated_at"]))


def snapshot_from_row(row: Mapping[Any, Any]) -> TrafficSnapshot:
    return TrafficSnapshot(id=int(row["id"]), run_id=row["run_id"], source=row["source"],
                           profile=dict(row["profile"] or {}), drift=dict(row["drift"] or {}),
                           created_at=float(row["created_at"]))


def evaluation_values_from_verdict(verdict: Mapping[str, Any], tier: str) -> dict[str, Any]:
    """`record_evaluation`'s arguments from a `Verdict.to_dict()` (the store does not import evaluate)."""
    speedup = verdict.get("speedup") or {}
    tiers = verdict.get("tiers") or []
    shapes = [{k: m.get(k) for k in ("kind", "batch_size", "tokens", "context_len", "num_layers", "weight")}
              for tier_result in tiers for m in tier_result.get("measurements", [])]
    return dict(
        candidate_id=str(verdict["candidate_id"]), incumbent_id=str(verdict.get("incumbent_id", "")),
        tier=tier or "+".join(str(tr.get("tier", "")) for tr in tiers) or "none",
        status=str(verdict.get("status", "accepted" if verdict.get("accepted") else "rejected")),
        accepted=bool(verdict.get("accepted", False)), stage=str(verdict.get("stage", "")),
        reason=str(verdict.get("reason", "")),
        speedup=_float(speedup.get("median")), speedup_ci_low=_float(speedup.get("ci_low")),
        speedup_ci_high=_float(speedup.get("ci_high")),
        gpu_s_per_1k=_float(verdict.get("gpu_s_per_1k_requests")),
        wall_s=float(verdict.get("wall_s") or 0.0), shapes=shapes, figures=verdict)
