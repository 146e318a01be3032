"""Candidates that kill or wedge the worker, two clients at once, and the sandbox."""

from __future__ import annotations

import threading
import uuid
from pathlib import Path

from engine_candidates import patched

from athanor.engine.candidate import Candidate, baseline_candidate
from athanor.engine.supervisor import Supervisor

PROMPTS = [[3, 1, 4], [1, 5]]


def _answers_with_incumbent(engine: Supervisor, incumbent: str, expected: tuple[tuple[int, ...], ...]) -> None:
    assert engine.health().active_candidate == incumbent
    assert engine.generate(PROMPTS, 4).tokens == expected


def test_crashing_candidates_are_killed_and_the_incumbent_comes_back(fresh: Supervisor) -> None:
    incumbent = fresh.health().active_candidate
    expected = fresh.generate(PROMPTS, 4).tokens
    aborting = Candidate.from_source("SEAM_VERSION = 2\nimport os\ndef build(model, ctx):\n    os.abort()\n")
    reply = fresh.swap(aborting)
    assert reply.status == "crashed" and "SIGABRT" in reply.error
    _answers_with_incumbent(fresh, incumbent, expected)
    segfault_in_decode = patched(
        "import ctypes\n"
        "_reference_build = build\n"
        "def build(model, ctx):\n"
        "    forward = _reference_build(model, ctx)\n"
        "    forward.prefill = lambda batch: ctypes.string_at(0)\n"
        "    return forward\n")
    assert fresh.swap(segfault_in_decode, keep_incumbent=True).status == "ok"
    reply = fresh.prefill(PROMPTS, [0, 1])
    assert reply.status == "crashed" and "SIGSEGV" in reply.error
    _answers_with_incumbent(fresh, incumbent, expected)


def test_a_hanging_candidate_times_out(fresh: Supervisor) -> None:
    incumbent = fresh.health().active_candidate
    expected = fresh.generate(PROMPTS, 4).tokens
    hanging = Candidate.from_source("SEAM_VERSION = 2\ndef build(model, ctx):\n    while True:\n        pass\n")
    reply = fresh.swap(hanging, timeout_s=3.0)
    assert reply.status == "timeout" and "did not answer" in reply.error
    _answers_with_incumbent(fresh, incumbent, expected)


def test_two_clients_at_once(fresh: Supervisor) -> None:
    expected = fresh.generate(PROMPTS, 5).tokens
    results: list[list[object]] = [[], []]

    def work(out: list[object]) -> None:
        client = fresh.connect(timeout_s=30)
        try:
            for _ in range(15):
                out.append(client.generate(PROMPTS, 5).tokens)
                out.append(client.stats().status)
        finally:
            client.close()

    threads = [threading.Thread(target=work, args=(out,)) for out in results]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    for out in results:
        assert len(out) == 30
        assert all(r == expected for r in out[::2]) and set(out[1::2]) == {"ok"}


def test_escape_attempts_change_nothing_and_the_verdict_says_so(fresh: Supervisor) -> None:
    probe = Path.home() / f"athanor-sandbox-probe-{uuid.uuid4().hex}"
    raw_probe = probe.with_name(probe.name + "-raw")
    sneaky = patched(
        "import ctypes, os, socket\n"
        "_reference_build = build\n"
        "def build(model, ctx):\n"
        f"    try:\n        open({str(probe)!r}, 'w').write('pwned')\n    except OSError:\n        pass\n"
        "    try:\n        socket.create_connection(('1.1.1.1', 80), timeout=1)\n    except OSError:\n        pass\n"
        "    # Straight to libc, around Python's audit hooks: the kernel still says no.\n"
        "    libc = ctypes.CDLL(None)\n"
        f"    fd = libc.open({str(raw_probe).encode()!r}, os.O_WRONLY | os.O_CREAT, 0o644)\n"
        "    assert fd < 0, 'the kernel let a write outside the scratch directory through'\n"
        "    (ctx.scratch_dir / 'notes.txt').write_text('allowed')\n"
        "    return _reference_build(model, ctx)\n")
    reply = fresh.swap(sneaky)
    assert reply.status == "violation", reply.error
    assert any(str(probe) in v for v in reply.violations)
    assert any(v.startswith("network") for v in reply.violations)
    assert "kernel let a write" not in reply.error
    assert not probe.exists() and not raw_probe.exists()
    assert fresh.health().active_candidate == baseline_candidate().id
    notes = Path(fresh.config.scratch_dir) / "candidates" / sneaky.id / "notes.txt"
    assert notes.read_text() == "allowed"  # the scratch directory is writable


def test_edits_to_athanor_modules_do_not_survive_a_swap(fresh: Supervisor) -> None:
    vandal = patched(
        "import athanor.model.reference as ref, athanor.model.sampling as sampling\n"
        "_reference_build = build\n"
        "def build(model, ctx):\n"
        "    ref.rms_norm = None\n"
        "    sampling.sample = None\n"
        "    return _reference_build(model, ctx)\n")
    assert fresh.swap(vandal).status == "ok"
    checker = Candidate.from_source(
        "SEAM_VERSION = 2\n"
        "import athanor.model.reference as ref, athanor.model.sampling as sampling\n"
        "def build(model, ctx):\n"
        "    assert ref.rms_norm is not None and sampling.sample is not None, 'an edit survived'\n"
        "    return ref.build(model, ctx)\n")
    reply = fresh.swap(checker)
    assert reply.status == "ok", reply.error
    assert fresh.generate(PROMPTS, 2).status == "ok"


def test_the_worker_reports_its_sandbox(engine: Supervisor) -> None:
    lines = engine.health().sandbox
    assert any(line.startswith("network:") for line in lines)
    assert any(line.startswith("filesystem:") for line in lines)
    assert any(line.startswith("memory:") for line in lines)
