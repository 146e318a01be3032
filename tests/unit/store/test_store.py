"""The store's API on both backends: runs, candidates, evaluations, leaderboard, board, deployments,
traffic snapshots, JSON hygiene and reopening in another process."""

from __future__ import annotations

import math
import pickle

import pytest

from athanor.errors import ConfigError
from athanor.store import LATEST_VERSION, candidate_id_of, open_store


def test_runs_lifecycle(store_location: str) -> None:
    with open_store(store_location) as store:
        assert store.schema_version() == LATEST_VERSION
        run = store.add_run("smollm2-135m", "preset:chat", "cpu", config={"budget_s": 180.0}, run_id="r1")
        assert store.get_run("r1") == run
        assert run.status == "running" and run.config == {"budget_s": 180.0}
        with pytest.raises(ConfigError, match="exists already"):
            store.add_run("m", "t", "cpu", run_id="r1")
        done = store.finish_run("r1", "interrupted", summary={"winner": "abc", "nan": math.nan})
        assert done.status == "interrupted" and done.finished_at is not None
        assert done.summary == {"winner": "abc", "nan": None}
        assert store.resume_run("r1").status == "running"
        with pytest.raises(ConfigError, match="no run named 'nope'"):
            store.resume_run("nope")
        assert store.get_run("nope") is None
        assert [r.id for r in store.runs()] == ["r1"]


def test_candidates_are_deduplicated_by_content(store_location: str) -> None:
    with open_store(store_location) as store:
        run = store.add_run("m", "t", "cpu")
        first = store.add_candidate(run.id, "def build(): ...\n", author="llm", description="one",
                                    manifest={"moves": ["fused_qkv"]})
        again = store.add_candidate(run.id, "def build(): ...\n", author="variant", description="two")
        assert first.id == candidate_id_of("def build(): ...\n") == again.id
        assert again.author == "llm" and again.manifest == {"moves": ["fused_qkv"]}
        child = store.add_candidate(run.id, "def build(): pass\n", parent_id=first.id, author="variant")
        assert [c.id for c in store.candidates(run.id)] == [first.id, child.id]
        assert [c.id for c in store.candidates(run.id, author="variant")] == [child.id]
        with pytest.raises(ConfigError, match="no run"):
            store.add_candidate("missing-run", "x = 1\n")


def _evaluate(store, run_id, cid, *, accepted, cost=math.nan, low=math.nan, tier="fast", wall_s=1.0):  # type: ignore[no-untyped-def]
    return store.record_evaluation(
        run_id, cid, tier=tier, status="accepted" if accepted else "rejected",
        stage="accepted" if accepted else "correctness", reason="" if accepted else "max_abs_err 3.1 > 1e-3",
        speedup=low + 0.05, speedup_ci_low=low, speedup_ci_high=low + 0.1, gpu_s_per_1k=cost, wall_s=wall_s,
        shapes=[{"kind": "decode", "batch_size": 1}], figures={"max_abs_err": math.inf})


def test_evaluations_leaderboard_and_recent_verdicts(store_location: str) -> None:
    with open_store(store_location) as store:
        run = store.add_run("m", "t", "cpu")
        a = store.add_candidate(run.id, "a = 1\n", author="variant", description="fused qkv")
        b = store.add_candidate(run.id, "b = 1\n", author="llm", parent_id=a.id, description="triton norm")
        c = store.add_candidate(run.id, "c = 1\n", author="llm")
        _evaluate(store, run.id, a.id, accepted=True, cost=10.0, low=1.05)
        _evaluate(store, run.id, a.id, accepted=True, cost=9.0, low=1.08, tier="slow")
        _evaluate(store, run.id, b.id, accepted=True, cost=8.0, low=1.2)
        bad = _evaluate(store, run.id, c.id, accepted=False)
        assert bad.author == "llm" and bad.figures == {"max_abs_err": None} and math.isnan(bad.gpu_s_per_1k)
        assert bad.shapes == ({"kind": "decode", "batch_size": 1},)

        board = store.leaderboard(run.id, 10)
        assert [(e.rank, e.candidate_id, e.gpu_s_per_1k) for e in board] == [(1, b.id, 8.0), (2, a.id, 9.0)]
        assert board[0].parent_id == a.id and board[0].description == "triton norm"
        assert [e.candidate_id for e in store.leaderboard(run.id, 1)] == [b.id]
        assert [e.tier for e in store.leaderboard(run.id, tier="slow")] == ["slow"]

        recent = store.recent_verdicts(run.id, 3)
        assert [v.candidate_id for v in recent] == [c.id, b.id, a.id]
        assert [v.candidate_id for v in store.recent_verdicts(run.id, author="llm")] == [c.id, b.id]
        assert len(store.evaluations(run.id, candidate_id=a.id)) == 2


def test_record_verdict_from_a_verdict_dict(store_location: str) -> None:
    verdict = {
        "candidate_id": "c" * 16, "incumbent_id": "i" * 16, "accepted": False, "stage": "timing",
        "reason": "speedup 1.01 [0.98, 1.04] does not clear the noise floor", "status": "rejected",
        "speedup": {"median": 1.01, "ci_low": 0.98, "ci_high": 1.04, "num_pairs": 60},
        "gpu_s_per_1k_requests": None, "wall_s": 12.5,
        "tiers": [{"tier": "fast", "num_layers": 2, "measurements": [
            {"kind": "decode", "batch_size": 4, "tokens": 1, "context_len": 128, "num_layers": 2, "weight": 1.0}]}],
    }
    with open_store(store_location) as store:
        run = store.add_run("m", "t", "cpu")
        rec = store.record_verdict(run.id, verdict)
        assert rec.tier == "fast" and rec.stage == "timing" and rec.wall_s == 12.5
        assert rec.speedup_ci_low == pytest.approx(0.98) and rec.incumbent_id == "i" * 16
        assert rec.shapes[0]["context_len"] == 128 and rec.figures["reason"].startswith("speedup")


def test_board_posts_since(store_location: str) -> None:
    with open_store(store_location) as store:
        run = store.add_run("m", "t", "cpu")
        first = store.post(run.id, "llm", "idea", "fuse gate and up projections")
        store.post(run.id, "variant", "result", "fused_qkv: 1.07x", candidate_id="ab" * 8)
        store.post(run.id, "cli", "warning", "flash backend fails at seq 1")
        assert [p.kind for p in store.posts(run.id)] == ["idea", "result", "warning"]
        assert [p.agent for p in store.posts(run.id, since=first.id)] == ["variant", "cli"]
        assert [p.agent for p in store.posts(run.id, limit=1)] == ["cli"]
        assert [p.agent for p in store.posts(run.id, kinds=["result"])] == ["variant"]
        with pytest.raises(ValueError, match="idea, result, warning"):
            store.post(run.id, "llm", "rumour", "x")


def test_deployments_and_traffic_snapshots(store_location: str) -> None:
    with open_store(store_location) as store:
        run = store.add_run("m", "t", "cpu")
        dep = store.add_deployment("ab" * 8, "http://localhost:8000", "canary", run_id=run.id,
                                   details={"share": 0.1})
        live = store.update_deployment(dep.id, "live", reason="canary clean after 500 requests")
        assert live.status == "live" and live.updated_at >= dep.created_at and live.details == {"share": 0.1}
        assert [d.id for d in store.deployments(run_id=run.id)] == [dep.id]
        snap = store.add_traffic_snapshot("preset:chat", {"prompt_len_p50": 512.0, "rate": math.nan},
                                          drift={"ks": 0.31}, run_id=run.id)
        assert snap.profile == {"prompt_len_p50": 512.0, "rate": None}
        assert store.traffic_snapshots(run_id=run.id)[0].drift == {"ks": 0.31}
        assert store.counts(run.id) == {"candidates": 0, "evaluations": 0, "posts": 0, "deployments": 1,
                                        "traffic_snapshots": 1}


def test_store_pickles_as_its_location(store_location: str) -> None:
    with open_store(store_location) as store:
        run = store.add_run("m", "t", "cpu")
        with pickle.loads(pickle.dumps(store)) as again:
            assert again.get_run(run.id) == run


def test_bad_locations_name_the_problem(tmp_path) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ConfigError, match="does not exist"):
        open_store(tmp_path / "missing" / "run.db")
    with pytest.raises(ConfigError, match="psycopg"):
        open_store("postgresql+asyncpg://u@h/db")
    with pytest.raises(ConfigError, match="cannot open"):
        open_store("postgresql://nobody@127.0.0.1:1/none")


def test_a_read_only_store_reads_live_and_refuses_writes(store_location: str) -> None:
    from sqlalchemy import exc

    writer = open_store(store_location)
    run = writer.add_run("m", "preset:chat", "cpu")
    reader = open_store(store_location, read_only=True)
    assert [r.id for r in reader.runs()] == [run.id]
    writer.post(run.id, "llm", "idea", "later")  # written after the reader opened: seen
    assert [p.text for p in reader.posts(run.id)] == ["later"]
    with pytest.raises(exc.DBAPIError):  # refused by the database itself
        reader.add_run("m", "preset:chat", "cpu")
    with pytest.raises(exc.DBAPIError):
        reader.update_deployment(writer.add_deployment("c", "t", "canary").id, "live")
    reader.close()
    writer.close()
    if "://" not in store_location:  # a reader never creates a store
        with pytest.raises(ConfigError, match="no such file"):
            open_store(f"{store_location}/other.db", read_only=True)
