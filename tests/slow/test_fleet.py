"""`athanor deploy DIR --server A --server B` (the rollout `athanor watch` runs with several --server): a winner goes
to a fleet one canary at a time through each server's admin API. Two real servers: a candidate both build is deployed
on both; one that only the second cannot build stops the rollout there and the first is rolled back to what it
served; one whose logits are wrong is rolled back by the first server's canary and never reaches the second. The
store holds every step."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from athanor.engine.candidate import Candidate, reference_source
from athanor.engine.candidate_dir import write_candidate_dir
from athanor.serve.launch import ServerProcess
from athanor.store import open_store

pytestmark = pytest.mark.slow  # two servers and three canaries: about a minute on 2 cores

MODEL = "tiny-dense"
TOKEN = "fleet-test-token-5e1c"

ONLY_TWO_SLOTS = '''

# Planted: the build refuses an engine of more than two slots (the second server has three).
_reference_build = build


def build(model, ctx):  # noqa: F811
    if ctx.max_seqs > 2:
        raise RuntimeError("planted: this candidate builds only with two slots")
    return _reference_build(model, ctx)
'''


WRONG_LOGITS = '''

# Planted fault: correct code whose logits are negated; the first server's canary must roll it back.
_reference_build = build


def build(model, ctx):  # noqa: F811
    forward = _reference_build(model, ctx)
    prefill, decode = forward.prefill, forward.decode
    forward.prefill, forward.decode = (lambda batch: -prefill(batch)), (lambda batch: -decode(batch))
    return forward
'''


def _candidate(root: Path, name: str, extra: str) -> Path:
    return write_candidate_dir(Candidate.from_source(reference_source() + extra, author="test", description=name),
                               root / name)


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[list[str]]:
    (tmp_path / "token").write_text(TOKEN + "\n")
    servers = [ServerProcess([MODEL, "--max-seqs", str(slots), "--max-seq-len", "128", "--admin-token-file",
                              str(tmp_path / "token")], tmp_path / f"server{slots}.log") for slots in (2, 3)]
    try:
        for server in servers:
            server.start()
        yield [server.url for server in servers]
    finally:
        for server in servers:
            server.stop()


def _deploy(tmp_path: Path, candidate: Path, urls: list[str]) -> subprocess.CompletedProcess[str]:
    servers = [arg for url in urls for arg in ("--server", url)]
    return subprocess.run([sys.executable, "-m", "athanor", "deploy", str(candidate), *servers, "--admin-token-file",
                           str(tmp_path / "token"), "--store", str(tmp_path / "fleet.sqlite"), "--timeout", "120"],
                          capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL)


def _serving(url: str) -> str:
    r = httpx.get(f"{url}/admin/current", headers={"Authorization": f"Bearer {TOKEN}"}, timeout=30)
    return str(r.json()["candidate_id"])


def test_a_fleet_takes_a_winner_one_canary_at_a_time_and_rolls_back_at_the_first_failure(
        tmp_path: Path, fleet: list[str]) -> None:
    good = _candidate(tmp_path, "good", "\n# the reference under another content hash\n")
    done = _deploy(tmp_path, good, fleet)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.strip().splitlines()[-1] == "rollout deployed to 2 server(s)"
    good_id = _serving(fleet[0])
    assert _serving(fleet[1]) == good_id

    picky = _candidate(tmp_path, "picky", ONLY_TWO_SLOTS)
    stopped = _deploy(tmp_path, picky, fleet)
    assert stopped.returncode == 1, stopped.stdout + stopped.stderr
    last = stopped.stdout.strip().splitlines()[-1]
    assert last.startswith(f"rollout stopped: {fleet[1]}: failed") and "builds only with two slots" in last, last
    assert _serving(fleet[0]) == good_id and _serving(fleet[1]) == good_id  # the first rolled back, the second kept it

    wrong = _candidate(tmp_path, "wrong", WRONG_LOGITS)
    refused = _deploy(tmp_path, wrong, fleet)
    assert refused.returncode == 1, refused.stdout + refused.stderr
    assert refused.stdout.strip().splitlines()[-1].startswith(f"rollout stopped: {fleet[0]}: rolled_back")
    assert fleet[1] not in refused.stdout  # never reached the second server
    assert _serving(fleet[0]) == good_id and _serving(fleet[1]) == good_id

    store = open_store(str(tmp_path / "fleet.sqlite"))
    steps = [(d.target, d.status) for d in reversed(store.deployments())]
    assert steps == [(fleet[0], "live"), (fleet[1], "live"),  # the good candidate, server by server
                     (fleet[0], "live"), (fleet[1], "failed"),  # the picky one: taken by the first, not the second
                     (fleet[0], "live"), (fleet[0], "rolled_back"),  # the first back on the good one
                     (fleet[0], "rolled_back")], steps  # the wrong one: its canary on the first refused it
    picky_id = next(d.candidate_id for d in store.deployments() if d.status == "failed")
    rolled = [d for d in store.deployments() if d.status == "rolled_back" and "fleet rollback" in d.reason]
    assert [d.candidate_id for d in rolled] == [picky_id]
