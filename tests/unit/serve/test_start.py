"""`athanor serve` runs what it is told to or nothing: a candidate that cannot build ends it before it listens."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from athanor.serve.launch import free_port
from conftest import BROKEN_BUILD, MODEL, TOKEN, candidate_dir


def test_a_candidate_that_cannot_build_stops_serve_with_its_reason(tmp_path: Path) -> None:
    broken = candidate_dir(tmp_path, "broken", BROKEN_BUILD)
    port = free_port("127.0.0.1")
    proc = subprocess.run([sys.executable, "-m", "athanor", "serve", "--model", MODEL, "--candidate", str(broken),
                           "--max-seqs", "2", "--max-seq-len", "256", "--port", str(port)],
                          capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)
    assert proc.returncode != 0
    errors = [line for line in proc.stderr.splitlines() if line.startswith("athanor: error")]
    assert len(errors) == 1, proc.stderr
    assert "did not build" in errors[0] and "planted: this candidate cannot build" in errors[0]
    assert "Traceback" not in proc.stderr
    assert f":{port}" not in proc.stderr + proc.stdout  # never announced, never listened


def test_a_busy_port_is_a_one_line_error_before_the_model_loads() -> None:
    import socket

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        proc = subprocess.run([sys.executable, "-m", "athanor", "serve", "--model", MODEL, "--port", str(port)],
                              capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        f"athanor: error: --port {port}: cannot listen on 127.0.0.1:{port} (Address already in use); choose another "
        "--port"]


def test_vllm_spellings_an_api_key_version_one_model_and_no_canary(tmp_path: Path) -> None:
    import httpx
    from openai import AuthenticationError, OpenAI

    from athanor.serve.launch import ServerProcess

    (tmp_path / "token").write_text(TOKEN)
    # `serve MODEL` and --max-model-len, as vLLM spells them; --no-canary: one resident, no deploys.
    server = ServerProcess([MODEL, "--max-model-len", "256", "--max-seqs", "2", "--api-key", "sk-test",
                            "--no-canary", "--admin-token-file", str(tmp_path / "token")],
                           tmp_path / "server.log").start()
    try:
        deploy = httpx.post(f"{server.url}/admin/deploy", json={"candidate_dir": str(tmp_path)},
                            headers={"Authorization": f"Bearer {TOKEN}"})
        assert deploy.status_code == 409 and deploy.json()["error"]["code"] == "canaries_off"
        assert httpx.get(f"{server.url}/health").status_code == 200  # no key needed outside /v1
        assert httpx.get(f"{server.url}/version").json()["version"]
        assert httpx.get(f"{server.url}/v1/models").status_code == 401
        with pytest.raises(AuthenticationError):
            OpenAI(base_url=f"{server.url}/v1", api_key="wrong", max_retries=0).models.list()
        client = OpenAI(base_url=f"{server.url}/v1", api_key="sk-test", max_retries=0)
        card = client.models.retrieve(MODEL)
        assert card.id == MODEL and card.model_extra and card.model_extra["max_model_len"] == 256
        missing = httpx.get(f"{server.url}/v1/models/nope", headers={"Authorization": "Bearer sk-test"})
        assert missing.status_code == 404 and missing.json()["error"]["code"] == "model_not_found"
    finally:
        server.stop()
