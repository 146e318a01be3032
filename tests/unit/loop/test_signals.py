"""SIGTERM ends `athanor compile` the way Ctrl-C does: no process and no temporary directory outlive it, and the
run is kept as interrupted."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

from athanor.store import open_store


def _marked(marker: str) -> list[int]:
    """Processes whose environment holds `marker` (what the compile and everything it started inherit)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if marker.encode() in (entry / "environ").read_bytes():
                    found.append(int(entry.name))
            except OSError:  # gone, or not ours to read
                continue
    return found


def test_sigterm_stops_every_child_and_removes_every_temp_dir(tmp_path: Path) -> None:
    marker = f"ATHANOR_TEST_MARK={uuid.uuid4().hex}"
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = dict(os.environ, TMPDIR=str(tmp), ATHANOR_TEST_MARK=marker.split("=", 1)[1])
    out = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-m", "athanor", "compile", "--model", "tiny-dense", "--budget", "5m",
                             "--out", str(out), "--device", "cpu"], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 120
        while len(_marked(marker)) < 2 and time.monotonic() < deadline:  # the compile and an engine worker
            assert proc.poll() is None, proc.communicate()[0]
            time.sleep(0.5)
        assert len(_marked(marker)) >= 2, "no engine worker started within 120 s"
        time.sleep(3)  # into the evaluations
        proc.send_signal(signal.SIGTERM)
        output = proc.communicate(timeout=120)[0]
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode in (130, 143), output  # interrupted
    assert "Traceback" not in output
    assert "no verified winner: interrupted after" in " ".join(output.split())  # what was judged, not a verdict
    deadline = time.monotonic() + 10
    while _marked(marker) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _marked(marker) == [], "processes outlived the compile"
    # torch's default Inductor cache (`torchinductor_<user>`, empty here) is a cache shared by runs, not run state.
    left = sorted(str(p.relative_to(tmp)) for p in tmp.rglob("*") if not p.name.startswith("torchinductor_"))
    assert left == [], f"temporary files outlived the compile: {left[:20]}"
    with open_store(out) as store:
        assert store.runs(limit=1)[0].status == "interrupted"
