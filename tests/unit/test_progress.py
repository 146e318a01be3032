"""The status line of long commands (`athanor.progress`): live under a pseudo-terminal, plain lines through a pipe;
and what the compile session and `bench serve` put in it."""

from __future__ import annotations

import fcntl
import io
import os
import pty
import select
import struct
import subprocess
import sys
import termios
import textwrap
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from rich.console import Console

from athanor.engine.candidate import Candidate
from athanor.evaluate import Speedup, Verdict
from athanor.progress import Progress

# A command's life in brief: fields and a status, an event line, a log record, a new status, the end.
SNIPPET = textwrap.dedent("""
    import logging, sys, time
    from athanor.progress import Progress

    logging.basicConfig(level=logging.INFO, format="%(message)s")
    with Progress(interval_s={interval}) as progress:
        progress.update(cells="0 of 2")
        progress.set("loading tiny-dense")
        time.sleep(0.6)
        progress.print("event: the model is loaded")
        logging.getLogger("athanor.test").info("a log record")
        progress.update(cells="1 of 2")
        progress.set("timing batch 8")
        time.sleep(0.6)
    print("summary")
""")

ESCAPE = "\x1b["


def _env() -> dict[str, str]:
    """This environment less what would make rich decide the terminal for itself (colour or width switches)."""
    unset = ("NO_COLOR", "FORCE_COLOR", "TTY_COMPATIBLE", "TTY_INTERACTIVE", "COLUMNS", "LINES", "TERM")
    return {**{k: v for k, v in os.environ.items() if k not in unset}, "TERM": "xterm-256color"}


def _on_a_terminal(code: str, timeout_s: float = 30.0) -> str:
    """What `code`, run by Python with its stdout and stderr on a pseudo-terminal of 120 columns, writes there."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
    proc = subprocess.Popen([sys.executable, "-c", code], stdin=slave, stdout=slave, stderr=slave, env=_env())
    os.close(slave)
    out = b""
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 0.5)
            if not ready:
                if proc.poll() is not None:
                    break
                continue
            try:
                chunk = os.read(master, 65536)
            except OSError:  # the child closed the terminal: all of it is read
                break
            if not chunk:
                break
            out += chunk
        assert proc.wait(timeout=10) == 0, out.decode(errors="replace")
    finally:
        os.close(master)
        if proc.poll() is None:
            proc.kill()
    return out.decode()


def test_the_status_line_is_live_on_a_terminal_with_events_above_it() -> None:
    out = _on_a_terminal(SNIPPET.format(interval=0.1))
    assert "cells 0 of 2 | loading tiny-dense" in out and "cells 1 of 2 | timing batch 8" in out
    assert "event: the model is loaded" in out and "a log record" in out and "summary" in out
    assert "\r" in out and ESCAPE in out  # redrawn in place
    assert out.index("event: the model is loaded") < out.rindex("cells 1 of 2")  # the event came above the line
    assert "\x1b[?25h" in out  # the cursor given back


def test_a_pipe_gets_plain_status_lines_now_and_then() -> None:
    done = subprocess.run([sys.executable, "-c", SNIPPET.format(interval=0.2)], capture_output=True, text=True,
                          env=_env(), timeout=30, check=True)
    lines = done.stdout.splitlines()
    assert "event: the model is loaded" in lines and lines[-1] == "summary"
    assert "cells 0 of 2 | loading tiny-dense" in lines and "cells 1 of 2 | timing batch 8" in lines
    assert len(lines) == len(set(lines))  # a status that did not change is not printed again
    assert ESCAPE not in done.stdout + done.stderr and "\r" not in done.stdout
    assert "a log record" in done.stderr  # a log's stream is left alone where it is no terminal


def test_an_interrupt_leaves_the_terminal_and_the_log_handlers_as_they_were() -> None:
    code = textwrap.dedent("""
        import logging, sys
        from athanor.progress import Progress

        logging.basicConfig(level=logging.INFO, format="%(message)s")
        handler, stdout = logging.getLogger().handlers[0], sys.stdout
        try:
            with Progress() as progress:
                progress.set("working")
                assert handler.stream is not sys.__stderr__  # taken over, above the live line
                raise KeyboardInterrupt
        except KeyboardInterrupt:
            pass
        print("restored" if handler.stream is sys.__stderr__ and sys.stdout is stdout else "not restored")
    """)
    out = _on_a_terminal(code)
    assert "restored" in out and "not restored" not in out
    assert out.rindex("\x1b[?25h") < out.index("restored")


def test_without_its_thread_a_plain_status_prints_as_it_is_set_at_most_once_per_interval() -> None:
    file = io.StringIO()
    with Progress(Console(file=file), interval_s=0.0, auto_refresh=False) as progress:
        progress.set("cell 1 of 2")
        progress.set("cell 1 of 2")
        progress.update(model="tiny-dense")
    with Progress(Console(file=file), interval_s=3600.0, auto_refresh=False) as progress:
        progress.set("cell 2 of 2")  # within the interval of the start: not printed
    assert file.getvalue().splitlines() == ["cell 1 of 2", "model tiny-dense | cell 1 of 2"]


def test_the_session_status_line() -> None:
    from athanor.loop.status import SessionStatus

    status = SessionStatus(budget_s=600.0, used_s=100.0, screened=3, confirmed=1, doing="screening abc by variant",
                           best_id="abc", best_tier="slow", best=Speedup(1.2345, 1.1, 1.3))
    assert status.text() == ("budget 100 s used, 500 s left | screened 3, confirmed 1 | best x1.234 [1.100, 1.300] "
                             "slow | screening abc by variant")
    assert "budget 700 s used, 0 s left" in status.text(since_s=600.0)  # a confirmation may run past the budget
    assert "| best - |" in SessionStatus(600.0, 0.0, 0, 0, "agent variant proposing").text()


def test_a_session_tells_its_status_hook_what_it_does_and_the_best_so_far(tmp_path: Path) -> None:
    from athanor.loop import CompileConfig
    from athanor.loop.session import Session
    from athanor.loop.status import SessionStatus

    statuses: list[SessionStatus] = []
    config = CompileConfig(model="tiny-dense", traffic="preset:chat", budget_s=100.0, out_dir=tmp_path / "run",
                           max_seqs=8, max_seq_len=256)
    session = Session(config, lambda line: None, clock=lambda: 0.0, max_candidates=2, status=statuses.append)

    class Faster:
        """A stand-in fast tier: every candidate timed 1.25x the baseline, at once."""

        config = SimpleNamespace(margin=0.01)

        def evaluate(self, candidate: Candidate, incumbent: Candidate) -> Verdict:
            return Verdict(candidate.id, incumbent.id, accepted=False, stage="timing", reason="stand-in",
                           speedup=Speedup(1.25, 1.2, 1.3, 16), gpu_s_per_1k_requests=1.0, wall_s=1.0)

    session._search(Faster(), deadline=float("inf"), guess=False)  # type: ignore[arg-type]
    doing = [s.doing for s in statuses]
    assert doing[0] == "agent variant proposing" and any(d.startswith("screening ") and d.endswith(" by variant")
                                                         for d in doing)
    assert statuses[0].best_id == "" and statuses[-1].screened == 1  # told before the second screen
    assert "best x1.250 [1.200, 1.300] fast" in statuses[-1].text()
    assert statuses[-1].budget_s == 100.0 and statuses[-1].used_s == 0.0


def test_bench_serve_status_line() -> None:
    from athanor.bench.serve import Sample, status_line

    samples = [Sample(8, 4, ok=True, output_tokens=4), Sample(8, 4, error="boom"), Sample(8, 4)]
    assert status_line(samples, 5, 2.0) == "2 of 5 requests done, 1 failed, 2.0 output tokens/s so far, 2 s"
    assert status_line([], 5, 0.0).startswith("0 of 5 requests done, 0 failed, 0.0 output tokens/s")


@pytest.mark.parametrize("fields", [{"a": 1, "b": None}, {}])
def test_fields_and_status_join_in_order(fields: dict[str, Any]) -> None:
    progress = Progress(Console(file=io.StringIO()))
    progress.update(**fields)
    progress.set(lambda: "now")
    assert progress.text() == ("a 1 | now" if fields else "now")


def test_the_watch_status_counts_windows_and_recompiles_from_its_event_lines() -> None:
    from athanor.commands.compile import _WatchTally

    tally = _WatchTally()
    for line in ("watch: log.jsonl from byte 0, windows of 60s, 2 windows and 1 recompiles so far",
                 "window 3: 40 requests; nothing moved",
                 "window 4: 41 requests; drift warrants a recompile: input length",
                 "recompile 2: compiling tiny-dense for the new traffic (10m) against the served reference forward"):
        tally.see(line)
    assert (tally.windows, tally.recompiles) == (4, 2)
    assert tally.text().startswith("windows 4, recompiles 2 | at ")
    assert tally.text().endswith(": recompile 2: compiling tiny-dense for the new traffic (10m) against the served "
                                 "reference forward")
