"""`athanor watch`: the Azure code trace, then the conversation trace, give one recompile (and its one deployment).

The log is fed in two parts with a restart of the watch between them (its state file carries the
offset, the open window and the reference profile across). The compile session is the real
`athanor.loop.compile_session` on a tiny preset; the deployment goes through a real server's admin API.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from athanor.serve.launch import ServerProcess
from athanor.traffic import read_columns

TRACES = Path(__file__).resolve().parents[3].parent / "shared" / "traces"
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
                           "--state", str(state), "--once"], capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.splitlines()


def test_watch_recompiles_once_and_deploys_once(tmp_path: Path) -> None:
    code, conv = TRACES / "azure_llm_2023_code.csv", TRACES / "azure_llm_2023_conv.csv"
    if not (code.is_file() and conv.is_file()):
        pytest.skip(f"the shared traces are not in {TRACES}")
    pytest.importorskip("athanor.loop", reason="athanor.loop.compile_session has not landed yet")
    token = tmp_path / "token"
    token.write_text("watch-token\n")
    log, state = tmp_path / "requests.jsonl", tmp_path / "watch.json"
    with ServerProcess(["--model", MODEL, "--max-seqs", "4", "--max-seq-len", "256", "--admin-token-file", str(token)],
                       tmp_path / "server.log") as server:
        log.write_text("\n".join(_records(code, 1.7e9)) + "\n")
        first = _watch(log, server.url, token, state)
        assert not any(line.startswith("recompile") for line in first), first
        with open(log, "a") as f:  # the traffic changes service, and the watch was restarted meanwhile
            f.write("\n".join(_records(conv, 1.7e9 + 3600)) + "\n")
        second = _watch(log, server.url, token, state)
        lines = first + second
        assert sum("drift warrants a recompile" in line for line in lines) == 1, lines
        deploys = [line for line in lines if line.startswith("deploy ")]
        history = httpx.get(f"{server.url}/admin/deployments", headers={"Authorization": "Bearer watch-token"}).json()
        report = json.loads((tmp_path / "watch.sessions" / "session-001" / "report.json").read_text())
        # A session that verified no winner (a short budget on 2 busy cores can end so) deploys nothing.
        expected = 1 if report["verified"] else 0
        assert len(deploys) == expected == len(history["data"]), "\n".join(lines)
        if expected:
            assert history["data"][0]["phase"] in ("deployed", "rolled_back")
            assert history["data"][0]["candidate_id"] == report["winner_id"][:16]
