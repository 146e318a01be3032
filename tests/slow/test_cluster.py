"""The compile loop on a Ray cluster (`--cluster`): a cluster of two nodes started as separate processes on this
machine (`ray start`), each offering one CPU screener pinned to a core of its own.

- The fast tier fans out over both screeners, the slow tier confirms on a worker of the cluster reserved for it, and
  the run gives the verified winner a run on this machine alone gives: a planted list whose only candidate faster
  than the slow incumbent (x2) is the reference forward, the others slower.
- Killing a screener's process in the middle of its screen: Ray restarts it, the candidate is screened again, the
  store holds one completed screen per candidate (and the lost attempt as worker-lost), the report names the worker.
- Both cluster runs keep their store in PostgreSQL where ATHANOR_TEST_POSTGRES_URL names a server (CI's).
- Nodes started with one GPU each: every screener holds a GPU of its own, named in its CUDA_VISIBLE_DEVICES.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from athanor.agents.registry import AGENT_FACTORIES
from athanor.engine.candidate import Candidate, baseline_candidate
from athanor.evaluate import EvaluateConfig
from athanor.loop import CompileConfig, compile_session
from athanor.serve.launch import free_port

sys.path.insert(0, str(Path(__file__).parents[1] / "unit" / "loop"))  # the loop tests' planted agent
sys.path.insert(0, str(Path(__file__).parents[1] / "unit" / "store"))  # and the store tests' PostgreSQL database
from loop_doubles import PlantedAgent
from postgres_db import POSTGRES_ENV, postgres_database

pytest.importorskip("ray", reason="the cluster tests need Ray: pip install 'athanor[cluster]'")
pytestmark = [pytest.mark.slow, pytest.mark.timing]  # verdicts on measured speed: run alone

RAY = [sys.executable, "-m", "ray.scripts.scripts"]


@pytest.fixture
def cluster(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A head and one more node, one CPU each (`gpus`: and one GPU each, as far as Ray is told); the address."""
    gpus = getattr(request, "param", 0)
    port = free_port()
    address = f"127.0.0.1:{port}"
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
    common = ["--num-cpus=1", f"--num-gpus={gpus}", "--disable-usage-stats"]
    try:
        subprocess.run([*RAY, "start", "--head", f"--port={port}", "--include-dashboard=false", *common], env=env,
                       check=True, capture_output=True, timeout=120)
        subprocess.run([*RAY, "start", f"--address={address}", *common], env=env, check=True, capture_output=True,
                       timeout=120)
        yield address
    finally:
        import ray

        if ray.is_initialized():
            ray.shutdown()
        subprocess.run([*RAY, "stop", "--force"], env=env, capture_output=True, timeout=120)


@pytest.fixture
def store() -> Iterator[str]:
    """The cluster run's store: a fresh PostgreSQL database where ATHANOR_TEST_POSTGRES_URL names a server (as CI's
    does), the kind a team's cluster shares; else the run's own SQLite file ("")."""
    if os.environ.get(POSTGRES_ENV):
        yield from postgres_database()
    else:
        yield ""


@pytest.fixture
def plant(monkeypatch: pytest.MonkeyPatch) -> Callable[[list[Candidate]], None]:
    """`plant(candidates)`: `--agents planted` proposes these (for this test only)."""
    def register(candidates: list[Candidate]) -> None:
        agent = PlantedAgent(candidates)
        monkeypatch.setitem(AGENT_FACTORIES, "planted", lambda config, board: agent)

    return register


def _compile(out: Path, slow_dir: Path, **kw: object) -> tuple[object, list[str]]:
    events: list[str] = []
    config = CompileConfig(model="tiny-dense", traffic="preset:chat", budget_s=60.0, out_dir=out, max_seqs=8,
                           max_seq_len=256, confirm_reserve_s=10.0, agents=("planted",), incumbent=slow_dir, **kw)
    return compile_session(config, on_event=events.append, clock=lambda: 0.0, max_candidates=3), events


def test_the_cluster_screens_in_parallel_and_confirms_the_winner_one_machine_confirms(
        tmp_path: Path, cluster: str, store: str, plant: Callable[[list[Candidate]], None],
        write_slow_candidate: Callable[..., Candidate]) -> None:
    write_slow_candidate(tmp_path / "incumbent")  # x2 slower than the reference
    slower = [write_slow_candidate(tmp_path / f"x{n}", n) for n in (3, 4)]
    planted = [*slower, Candidate.from_source(slower[0].source + "\n# again\n")]
    plant(planted)
    alone, _ = _compile(tmp_path / "alone", tmp_path / "incumbent")
    plant(planted)
    spread, events = _compile(tmp_path / "cluster", tmp_path / "incumbent", cluster=cluster, store=store)
    log = "\n".join(events)
    assert "2 screeners on 2 node(s)" in log and "confirming on the cluster's worker pid" in log, log
    reference = baseline_candidate().id
    assert alone.verified and spread.verified, log  # type: ignore[attr-defined]
    assert alone.winner_id == spread.winner_id == reference, log  # type: ignore[attr-defined]


@pytest.mark.parametrize("cluster", [1], indirect=True)
def test_each_screener_holds_a_gpu_of_its_own(cluster: str) -> None:
    from athanor.loop.cluster import ScreenPool

    pool = ScreenPool(cluster, EvaluateConfig(model="tiny-dense", device="cuda"))  # engines start only on a screen
    try:
        assert len(pool) == 2 and len({p.node_id for p in pool.placements}) == 2
        for p in pool.placements:
            assert len(p.gpu_ids) == 1 and p.visible_devices == str(p.gpu_ids[0]), p
    finally:
        pool.close()


def test_a_screener_killed_mid_screen_is_replaced_and_its_candidate_screened_again(
        tmp_path: Path, cluster: str, store: str, plant: Callable[[list[Candidate]], None],
        write_slow_candidate: Callable[..., Candidate]) -> None:
    import athanor.loop.cluster as cluster_module

    write_slow_candidate(tmp_path / "incumbent")
    planted = [write_slow_candidate(tmp_path / f"x{n}", n) for n in (3, 4)]
    plant(planted)
    killed: list[int] = []
    submit = cluster_module.ScreenPool.submit

    def submit_and_kill(self, candidate, baseline):  # type: ignore[no-untyped-def]
        def kill() -> None:
            time.sleep(4.0)  # inside the first screens (engines start, then timing)
            os.kill(killed[0], signal.SIGKILL)

        if not killed:  # the first screen submitted: its screener dies four seconds in
            killed.append(self.placements[0].pid)
            threading.Thread(target=kill, daemon=True).start()
        submit(self, candidate, baseline)

    cluster_module.ScreenPool.submit = submit_and_kill  # type: ignore[method-assign]
    try:
        report, events = _compile(tmp_path / "run", tmp_path / "incumbent", cluster=cluster, store=store)
    finally:
        cluster_module.ScreenPool.submit = submit  # type: ignore[method-assign]
    log = "\n".join(events)
    assert killed and any("died during the screen" in e for e in events), log
    from athanor.store import open_store

    with open_store(store or tmp_path / "run") as opened:
        evaluations = opened.evaluations(report.run_id)  # type: ignore[attr-defined]
    fast = [ev for ev in evaluations if ev.tier == "fast"]
    done = [ev.candidate_id for ev in fast if ev.stage != "worker-lost"]
    assert sorted(done) == sorted({baseline_candidate().id, *(c.id for c in planted)}), done
    assert len([ev for ev in fast if ev.stage == "worker-lost"]) >= 1
    md = (tmp_path / "run" / "report.md").read_text()
    assert f"pid {killed[0]}" in md, md
