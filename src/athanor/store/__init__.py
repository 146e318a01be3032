"""The experiment database: runs, candidates, evaluations, board posts, deployments and traffic
snapshots, in SQLite (a file in the run directory, WAL mode) or PostgreSQL (by URL).

    store = open_store(run_dir)              # or "postgresql://user@host/db"
    run = store.add_run("smollm2-135m", "preset:chat", "cpu")
    cand = store.add_candidate(run.id, source, author="llm", parent_id=incumbent_id)
    store.record_verdict(run.id, verdict.to_dict(), tier="fast")
    store.leaderboard(run.id, 10)
"""

from athanor.store.migrations import LATEST_VERSION
from athanor.store.records import (
    POST_KINDS,
    CandidateRecord,
    Deployment,
    EvaluationRecord,
    LeaderboardEntry,
    Post,
    PostKind,
    Run,
    TrafficSnapshot,
)
from athanor.store.store import Store, candidate_id_of, open_store

__all__ = [
    "LATEST_VERSION",
    "POST_KINDS",
    "CandidateRecord",
    "Deployment",
    "EvaluationRecord",
    "LeaderboardEntry",
    "Post",
    "PostKind",
    "Run",
    "Store",
    "TrafficSnapshot",
    "candidate_id_of",
    "open_store",
]
