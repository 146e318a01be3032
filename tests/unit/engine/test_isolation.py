"""Workers out of each other's reach: authenticated requests, no credentials, their own namespaces.

Each test lets a candidate (or a capless root process, which is what a candidate is) try the thing the
mechanism forbids, straight to the kernel where Python's hooks could be walked around, and checks
the kernel's answer from outside the worker.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import zmq
from engine_candidates import CONFIG, patched

from athanor.engine import auth, procs
from athanor.engine import protocol as p
from athanor.engine.supervisor import Supervisor, Timeouts

TIMEOUTS = Timeouts(start_s=120, swap_s=60, run_s=30, other_s=30)
SECRET = f"athanor-victim-{uuid.uuid4().hex}"


@pytest.fixture(scope="module")
def victim() -> Iterator[Supervisor]:
    """A second worker (the reference, say) with a secret in its environment."""
    os.environ["ATHANOR_TEST_SECRET"] = SECRET
    try:
        sup = Supervisor(CONFIG, TIMEOUTS)
        sup.start()
    finally:
        del os.environ["ATHANOR_TEST_SECRET"]
    yield sup
    sup.close()


def _results(engine: Supervisor, source: str) -> dict[str, Any]:
    """Swap in the baseline patched with `source`, whose build writes its findings to results.json."""
    candidate = patched(source)
    reply = engine.swap(candidate, keep_incumbent=True)
    assert reply.status == "ok", reply.error
    path = Path(engine.config.scratch_dir) / "candidates" / candidate.id / "results.json"
    results: dict[str, Any] = json.loads(path.read_text())
    return results


def test_the_worker_reports_every_mechanism(engine: Supervisor) -> None:
    lines = engine.health().sandbox
    for prefix in ("requests:", "processes:", "mounts:", "compile cache:", "credentials:"):
        line = next(x for x in lines if x.startswith(prefix))
        assert "NOT" not in line, line  # measured as root on the project's machines: all of them hold


def test_requests_without_the_key_are_dropped_unread(fresh: Supervisor) -> None:
    header = {"v": p.PROTOCOL_VERSION, "id": 7, "body": {"__type__": "HealthRequest", "fields": {}}}
    frame = json.dumps(header).encode()
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(f"ipc://{fresh.socket_path}")
    try:
        for frames in ([frame],  # no MAC at all
                       [os.urandom(auth.MAC_BYTES), frame],  # a made-up one
                       auth.sign(auth.new_key(), [frame]),  # a real MAC under another key
                       [auth.mac(fresh.client_key, [frame]), frame + b" "]):  # a MAC of another frame
            sock.send_multipart(frames)
            assert not sock.poll(1000), f"the worker answered {frames[:1]!r}"
        assert fresh.health().status == "ok"  # the real client is still served
        sock.send_multipart(auth.sign(fresh.client_key, [frame]))  # and anyone given the key
        assert sock.poll(10_000)
        assert p.decode(sock.recv_multipart())[1].status == "ok"
    finally:
        sock.close(linger=0)
    assert "dropped a request without a valid MAC (4 so far)" in fresh.log_path.read_text()


def test_the_key_is_in_no_argv_environment_or_file(fresh: Supervisor) -> None:
    key = fresh.client_key
    worker = fresh.worker_pid
    assert worker is not None and len(key) == auth.KEY_BYTES
    for pid in (worker, fresh.pid):
        for what in ("cmdline", "environ"):
            data = Path(f"/proc/{pid}/{what}").read_bytes()
            assert key not in data and key.hex().encode() not in data
    for path in fresh.run_dir.glob("*.*"):
        if path.is_file():
            assert key.hex().encode() not in path.read_bytes() and key not in path.read_bytes()


def test_a_candidate_holds_no_credentials_and_sees_no_other_process(fresh: Supervisor, victim: Supervisor) -> None:
    targets = {"victim": victim.worker_pid, "evaluator": os.getpid()}
    found = _results(fresh, (
        "import ctypes, json, os\n"
        "_reference_build = build\n"
        "def build(model, ctx):\n"
        "    status = open('/proc/self/status').read().splitlines()\n"
        "    out = {'caps': {l.split(':')[0]: int(l.split()[1], 16) for l in status if l.startswith('Cap')},\n"
        "           'dumpable': ctypes.CDLL(None).prctl(3, 0, 0, 0, 0),\n"
        "           'pids': sorted(int(n) for n in os.listdir('/proc') if n.isdigit())}\n"
        f"    for name, pid in {targets!r}.items():\n"
        "        for what in ('environ', 'mem', 'fd'):\n"
        "            try:\n"
        "                out[name + ' ' + what] = 'read %d entries' % len(os.listdir(f'/proc/{pid}/fd')) \\\n"
        "                    if what == 'fd' else 'read ' + open(f'/proc/{pid}/{what}', 'rb').read(1 << 16).hex()\n"
        "            except OSError as e:\n"
        "                out[name + ' ' + what] = type(e).__name__\n"
        "    (ctx.scratch_dir / 'results.json').write_text(json.dumps(out))\n"
        "    return _reference_build(model, ctx)\n"))
    assert set(found["caps"]) == {"CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"}
    assert not any(found["caps"].values()), found["caps"]
    assert found["dumpable"] == 0
    assert max(found["pids"]) < 100, found["pids"]  # its own PID namespace's /proc: no other worker in it
    for name in targets:
        for what in ("environ", "mem", "fd"):
            assert not found[f"{name} {what}"].startswith("read"), (name, what, found[f"{name} {what}"][:80])


CAPLESS_READER = """
import os, sys
from athanor.engine.credentials import drop_credentials
if sys.argv[1] == "drop":
    assert drop_credentials().startswith("credentials: no capabilities")
for path in sys.argv[2:]:
    try:
        with open(path, "rb") as f:
            print(path, "read", f.read(1 << 16).hex() if path.endswith("environ") else "")
    except OSError as e:
        print(path, type(e).__name__)
"""


def _read_as(credentials: str, *paths: str) -> dict[str, str]:
    out = subprocess.run([sys.executable, "-c", CAPLESS_READER, credentials, *paths], capture_output=True,
                         text=True, check=True, timeout=60).stdout
    return {line.split()[0]: " ".join(line.split()[1:]) for line in out.splitlines()}


def test_a_capless_root_process_cannot_read_a_worker_or_the_evaluator(victim: Supervisor) -> None:
    """The kernel's ptrace check, with the PID namespace's hiding left out: a uid-0 process without
    capabilities (what a candidate is) against a worker's and the evaluator's /proc entries."""
    worker = victim.worker_pid
    paths = [f"/proc/{worker}/environ", f"/proc/{worker}/mem", f"/proc/{os.getpid()}/environ"]
    privileged = _read_as("keep", *paths)  # the control: these files are there and say something
    assert SECRET.encode().hex() in privileged[paths[0]]
    capless = _read_as("drop", *paths)
    for path in paths:
        assert capless[path] == "PermissionError", (path, capless[path][:80])


def _states(*pids: int) -> set[str]:
    return {st.state if (st := procs.stat(pid)) else "gone" for pid in pids}


def _until(condition: Callable[[], bool], timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_nothing_a_candidate_starts_or_writes_outlives_its_worker(tmp_path: Path) -> None:
    shm = f"athanor-left-behind-{uuid.uuid4().hex}"
    sup = Supervisor(CONFIG, TIMEOUTS)
    try:
        sup.start()
        found = _results(sup, (
            "import json, os, subprocess, tempfile\n"
            "_reference_build = build\n"
            "def build(model, ctx):\n"
            "    # a grandchild in a session of its own: neither waited for nor in the worker's process group\n"
            "    subprocess.run(['sh', '-c', 'setsid sleep 1000 >/dev/null 2>&1 & exit 0'], check=True)\n"
            f"    open('/dev/shm/{shm}', 'w').write('left behind')\n"
            "    fd, path = tempfile.mkstemp(prefix='left-behind-')\n"
            "    os.close(fd)\n"
            "    (ctx.scratch_dir / 'results.json').write_text(json.dumps({'tmp': path}))\n"
            "    return _reference_build(model, ctx)\n"))
        deadline = time.monotonic() + 10
        while not (sleepers := [x for x in sup.extra_processes() if x.endswith(" sleep")]):
            assert time.monotonic() < deadline, sup.extra_processes()
            time.sleep(0.05)
        child = int(sleepers[0].split()[0])
        worker = sup.worker_pid
        assert worker is not None and child not in procs.descendants(worker)  # an orphan, re-parented to the init

        sup.signal_all(signal.SIGSTOP)
        _until(lambda: _states(worker, child) == {"T"})  # a signal takes effect when the process next runs
        sup.signal_all(signal.SIGCONT)
        _until(lambda: "T" not in _states(worker, child))
        assert sup.cpu_seconds() > 0 and sup.health().status == "ok"

        assert Path(found["tmp"]).parent == Path(sup.config.scratch_dir) / "tmp"
        assert not Path(found["tmp"]).exists()  # written to the worker's own tmpfs: not in the scratch dir
        assert not Path("/dev/shm", shm).exists()  # nor in the caller's /dev/shm
    finally:
        sup.close()
    assert procs.is_gone(child)
    assert not Path("/dev/shm", shm).exists()


def test_an_untrusted_worker_only_reads_the_shared_compile_cache(tmp_path: Path) -> None:
    shared = tmp_path / "shared-cache"
    shared.mkdir()
    (shared / "seed.txt").write_text("from a trusted worker")
    config = dataclasses.replace(CONFIG, cache_dir=str(shared))
    with Supervisor(config, dataclasses.replace(TIMEOUTS, swap_s=300)) as sup:
        sup.start()
        line = next(x for x in sup.health().sandbox if x.startswith("compile cache:"))
        assert "read-only (overlay)" in line, line
        found = _results(sup, (
            "import ctypes, json, os\n"
            "_reference_build = build\n"
            "def build(model, ctx):\n"
            "    libc = ctypes.CDLL(None, use_errno=True)  # straight to the kernel, around the audit hook\n"
            f"    fd = libc.open({str(shared / 'planted').encode()!r}, os.O_WRONLY | os.O_CREAT, 0o644)\n"
            "    own = os.path.dirname(os.environ['TORCHINDUCTOR_CACHE_DIR'])\n"
            "    out = {'planted': fd >= 0, 'own': own, 'seed': open(os.path.join(own, 'seed.txt')).read()}\n"
            "    (ctx.scratch_dir / 'results.json').write_text(json.dumps(out))\n"
            "    return _reference_build(model, ctx)\n"))
        assert not found["planted"]
        assert found["seed"] == "from a trusted worker"  # the shared entries are there to read
        own = Path(found["own"])
        assert own.is_relative_to(sup.config.scratch_dir)  # (its compiles land there: tests/slow/engine)
        assert sorted(x.name for x in shared.iterdir()) == ["seed.txt"]
    trusted = dataclasses.replace(config, trusted=True)
    with Supervisor(trusted, TIMEOUTS) as sup:
        sup.start()
        lines = sup.health().sandbox
        assert any(x.startswith("compile cache:") and "writable (a trusted worker)" in x for x in lines)
        assert any(x.startswith("filesystem:") and str(shared) in x for x in lines)
