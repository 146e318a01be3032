"""`athanor watch`: the Azure code trace, then the conversation trace, give one recompile (and its one deployment).

The log is fed in two parts with a restart of the watch between them (its state file carries the
offset, the open window and the reference profile across). The server starts with a planted candidate
that is correct but twice as slow as the reference; the watch asks the server what it serves
(`GET /admin/current`) and the recompile (the real `athanor.loop.compile_session` on a tiny preset)
is timed against it, so its winner (the reference forward at least) beats it by a margin that survives
busy cores, and the one deployment goes through a real server's admin API and canary.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from athanor.engine.candidate import Candidate
from athanor.serve.launch import ServerProcess
from athanor.store import open_store
from athanor.traffic import read_columns

# Two watch processes, a server and a 40 s recompile (a few minutes on 2 cores), its verdict on measured speed.
pytestmark = [pytest.mark.slow, pytest.mark.timing]

MODEL = "tiny-dense"


def _records(path: Path, base: float) -> list[str]:
    trace = read_columns(path)
    rel = trace.timestamp_s - trace.timestamp_s[0]
    return [json.dumps({"timestamp": base + float(t), "input_length": int(i), "output_length": int(o),
                        "hash_ids": [], "ttft_s": 0.1, "latency_s": 1.0})
            for t, i, o in zip(rel, trace.input_length, trace.output_length)]


def _watch(log: Path, server: str, token_file: Path, state: Path) -> list[str]:
    done = subprocess.run([sys.executable, "-m", "athanor", "watch", "--model", MODEL, "--log", str(log), "--server",
                           server, "--admin-token-file", str(token_file), "--window", "10m", "--budget", "40s",
                           "--state", str(state), "--once", "--store", str(state.with_name("store.db"))],
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.splitlines()


def test_watch_recompiles_once_and_deploys_once(tmp_path: Path, shared_traces: Path,
                                                write_slow_candidate: Callable[[Path], Candidate]) -> None:
    code, conv = shared_traces / "azure_llm_2023_code.csv", shared_traces / "azure_llm_2023_conv.csv"
    if not (code.is_file() and conv.is_file()):
        pytest.skip(f"the Azure code and conversation traces are not in {shared_traces}")
    token = tmp_path / "token"
    token.write_text("watch-token\n")
    auth = {"Authorization": "Bearer watch-token"}
    log, state = tmp_path / "requests.jsonl", tmp_path / "watch.json"
    slow = write_slow_candidate(tmp_path / "slow")
    with ServerProcess(["--model", MODEL, "--max-seqs", "4", "--max-seq-len", "256", "--admin-token-file", str(token),
                        "--candidate", str(tmp_path / "slow")], tmp_path / "server.log") as server:
        assert httpx.get(f"{server.url}/admin/current").status_code == 401
        current = httpx.get(f"{server.url}/admin/current", headers=auth).json()
        assert current["candidate_id"] == slow.id and current["candidate_dir"] == str((tmp_path / "slow").resolve())
        log.write_text("\n".join(_records(code, 1.7e9)) + "\n")
        first = _watch(log, server.url, token, state)
        assert not any(line.startswith("recompile") for line in first), first
        with open(log, "a") as f:  # the traffic changes service, and the watch was restarted meanwhile
            f.write("\n".join(_records(conv, 1.7e9 + 3600)) + "\n")
        second = _watch(log, server.url, token, state)
        lines = first + second
        assert sum("drift warrants a recompile" in line for line in lines) == 1, lines
        assert any(f"against the served candidate {slow.id}" in line for line in lines), lines
        deploys = [line for line in lines if line.startswith("deploy ")]
        history = httpx.get(f"{server.url}/admin/deployments", headers=auth).json()
        session = tmp_path / "watch.sessions" / "session-001"
        report = json.loads((session / "report.json").read_text())
        assert report["verified"], report.get("reason")
        assert report["incumbent"]["id"] == slow.id and report["speedup"]["against"] == "incumbent", report
        assert len(deploys) == 1 == len(history["data"]), "\n".join(lines)
        assert history["data"][0]["phase"] == "deployed", history
        assert history["data"][0]["candidate_id"] == report["winner_id"][:16]
        current = httpx.get(f"{server.url}/admin/current", headers=auth).json()
        assert current["candidate_id"] == report["winner_id"][:16]
        assert current["candidate_dir"] == str((session / "winner").resolve())
    # The store the watch wrote (the dashboard's traffic page): a snapshot per window, the drift's, and what it led to.
    with open_store(tmp_path / "store.db") as store:
        snapshots = store.traffic_snapshots(limit=1000)[::-1]
    windows = sum(line.startswith("window ") for line in lines)
    assert len(snapshots) == windows and all(s.source.startswith("watch:") for s in snapshots)
    recompiled = [s for s in snapshots if s.drift.get("recompile")]
    assert len(recompiled) == 1 and recompiled[0].drift["moved"], [s.drift for s in snapshots]
    assert recompiled[0].drift["recompile"]["status"] == "deployed"
    assert recompiled[0].drift["recompile"]["winner"] == report["winner_id"][:16]
