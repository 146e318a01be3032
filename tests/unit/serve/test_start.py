"""`athanor serve` runs what it is told to or nothing: a candidate that cannot build ends it before it listens."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from athanor.serve.launch import free_port
from conftest import BROKEN_BUILD, MODEL, candidate_dir


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
