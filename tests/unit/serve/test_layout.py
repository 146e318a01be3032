"""`athanor serve` in a layout on the CPU: two ranks (gloo over the sandbox's loopback), each holding its shard of
smollm2 (9 query heads over 3 KV heads: blocks of one and two KV groups), answer concurrent requests with the tokens
one device gives; a deploy that fails to build on one rank only is refused on all, and the incumbent serves on.
The layout comes from `--layout tp=2`, or from the candidate (a compile's winner declares the layout it won in)."""

from __future__ import annotations

import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
from openai import OpenAI

from athanor.serve.launch import ServerProcess
from conftest import MODEL, TOKEN, Server, candidate_dir

PROMPTS = ["The capital of France is", "def fibonacci(n):", "Once upon a time, in a small village,",
           "The capital of France is a city where"]  # the last shares the first's prefix

FAILS_ON_RANK_ONE = '''

# Planted fault: the build fails on the second rank of a layout only.
_reference_build = build


def build(model, ctx):  # noqa: F811
    if ctx.rank == 1:
        raise RuntimeError("planted: rank one cannot build this")
    return _reference_build(model, ctx)
'''


def _declaring(root: Path, name: str, layout: str) -> Path:
    return candidate_dir(root, name, f'\n# the layout a compile confirmed it in\nLAYOUT = "{layout}"\n')


def _complete_all(url: str) -> list[str]:
    """Every prompt at once (batched decode rows, prefill chunks beside them), greedy."""
    c = OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=120)

    def one(prompt: str) -> str:
        return c.completions.create(model=MODEL, prompt=prompt, temperature=0, max_tokens=20).choices[0].text

    with ThreadPoolExecutor(len(PROMPTS)) as pool:
        return list(pool.map(one, PROMPTS))


def test_tp2_answers_as_one_device_and_a_deploy_failing_on_one_rank_changes_nothing(server: Server,
                                                                                     tmp_path: Path) -> None:
    (tmp_path / "token").write_text(TOKEN + "\n")
    # No --layout: the candidate's LAYOUT = "tp2" starts the two ranks.
    tp2 = ServerProcess(["--model", MODEL, "--candidate", str(_declaring(tmp_path, "tp2", "tp2")), "--max-seqs", "4",
                         "--max-seq-len", "256",
                         "--max-num-batched-tokens", "16", "--admin-token-file", str(tmp_path / "token")],
                        tmp_path / "server.log").start()
    try:
        answers = _complete_all(tp2.url)
        assert answers == _complete_all(server.url)
        assert "Paris" in answers[0]
        before = httpx.get(f"{tp2.url}/health").json()["candidate"]
        admin = {"Authorization": f"Bearer {TOKEN}"}
        r = httpx.post(f"{tp2.url}/admin/deploy", json={"candidate_dir": str(candidate_dir(tmp_path, "rank1",
                                                                                           FAILS_ON_RANK_ONE))},
                       headers=admin, timeout=60)
        assert r.status_code == 202, r.text
        dep = r.json()["deployment"]
        deadline = time.monotonic() + 120
        while dep["phase"] not in ("deployed", "rolled_back", "failed") and time.monotonic() < deadline:
            time.sleep(0.3)
            dep = httpx.get(f"{tp2.url}/admin/deployments/{dep['id']}", headers=admin).json()["deployment"]
        assert dep["phase"] == "failed" and "rank 1 of 2 failed" in dep["reason"], dep
        assert "planted: rank one cannot build this" in dep["reason"]
        assert httpx.get(f"{tp2.url}/health").json()["candidate"] == before
        assert _complete_all(tp2.url) == answers  # both ranks still run the incumbent, in step
        # A candidate declaring another layout is refused by every rank: a server's layout is set at its start.
        r = httpx.post(f"{tp2.url}/admin/deploy", json={"candidate_dir": str(_declaring(tmp_path, "dcp2", "dcp2"))},
                       headers=admin, timeout=60)
        dep = r.json()["deployment"]
        while dep["phase"] not in ("deployed", "rolled_back", "failed") and time.monotonic() < deadline:
            time.sleep(0.3)
            dep = httpx.get(f"{tp2.url}/admin/deployments/{dep['id']}", headers=admin).json()["deployment"]
        assert dep["phase"] == "failed" and 'declares LAYOUT = "dcp2"; this engine runs tp2' in dep["reason"], dep
        assert httpx.get(f"{tp2.url}/health").json()["candidate"] == before
    finally:
        tp2.stop()


def test_a_layout_the_engine_cannot_run_is_a_one_line_error(tmp_path: Path) -> None:
    tp2 = str(_declaring(tmp_path, "tp2", "tp2"))
    for flags, words in ((["--layout", "tp=0"], "give degrees as KEY=N"),
                         (["--layout", "dp=2"], "DP replicas and PP stages are not built"),
                         (["--layout", "tp=4"], "does not divide"),
                         (["--candidate", tp2, "--layout", "tp=3"], 'declares LAYOUT = "tp2"; drop --layout')):
        proc = subprocess.run([sys.executable, "-m", "athanor", "serve", "--model", MODEL, *flags, "--port", "0"],
                              capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
        errors = [line for line in proc.stderr.splitlines() if line.startswith("athanor: error")]
        assert proc.returncode != 0 and len(errors) == 1 and words in errors[0], (flags, proc.stderr[-2000:])
        assert "Traceback" not in proc.stderr
