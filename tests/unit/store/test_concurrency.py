"""Concurrent writers lose no rows: threads sharing one `Store`, and processes each opening the same
(initially empty, so they also race to migrate it) database."""

from __future__ import annotations

import multiprocessing
from concurrent.futures import ThreadPoolExecutor

from athanor.store import Store, open_store

ROWS_PER_WRITER = 40


def _write_rows(store: Store, run_id: str, writer: int) -> None:
    """Interleave the writes an agent and an evaluator make: a candidate, its verdict, a post."""
    for i in range(ROWS_PER_WRITER):
        cand = store.add_candidate(run_id, f"# writer {writer} row {i}\n", author=f"agent{writer}")
        store.record_evaluation(run_id, cand.id, tier="fast", status="rejected", stage="smoke", reason="x",
                                wall_s=0.01)
        store.post(run_id, f"agent{writer}", "result", f"row {i}", candidate_id=cand.id)
        # Also re-add a shared candidate: duplicates must resolve, not fail, under contention.
        store.add_candidate(run_id, "# shared by every writer\n", author=f"agent{writer}")
        store.leaderboard(run_id, 5)


def _process_writer(location: str, run_id: str, writer: int, start: multiprocessing.synchronize.Event) -> None:
    with open_store(location) as store:  # every process opens (and may migrate) at once
        start.wait()
        _write_rows(store, run_id, writer)


def _expected(num_writers: int) -> dict[str, int]:
    return {"candidates": num_writers * ROWS_PER_WRITER + 1, "evaluations": num_writers * ROWS_PER_WRITER,
            "posts": num_writers * ROWS_PER_WRITER, "deployments": 0, "traffic_snapshots": 0}


def test_threads_lose_no_rows(store_location: str) -> None:
    num_writers = 8
    with open_store(store_location) as store:
        run = store.add_run("m", "t", "cpu")
        with ThreadPoolExecutor(num_writers) as pool:
            for future in [pool.submit(_write_rows, store, run.id, w) for w in range(num_writers)]:
                future.result()
        assert store.counts(run.id) == _expected(num_writers)


def test_processes_lose_no_rows(store_location: str) -> None:
    num_writers = 4
    ctx = multiprocessing.get_context("spawn")
    start = ctx.Event()
    # The children open the empty store as the parent does, so they race to migrate it; they write
    # once the parent has added the run.
    procs = [ctx.Process(target=_process_writer, args=(store_location, "shared-run", w, start))
             for w in range(num_writers)]
    for p in procs:
        p.start()
    with open_store(store_location) as store:
        store.add_run("m", "t", "cpu", run_id="shared-run")
        start.set()
        for p in procs:
            p.join(timeout=120)
            assert p.exitcode == 0, f"writer process {p.pid} exited with {p.exitcode}"
        assert store.counts("shared-run") == _expected(num_writers)
        assert len({e.id for e in store.evaluations("shared-run")}) == num_writers * ROWS_PER_WRITER
