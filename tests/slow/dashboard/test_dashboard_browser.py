"""The dashboard in a real browser (Debian's chromium, driven headless by Playwright) over the store of a real tiny
compile: the run's page updates while the compile writes, without a reload; then every page renders, the
leaderboard shows the winner and its interval, a refused candidate shows its reason, and markup planted in a
candidate's description and a board post shows as text. A screenshot of each page is saved (the test prints where).

Outside CI a machine without chromium skips, saying so; under CI (`CI` set, as `.ci/run` runs) it fails instead."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from athanor.engine.candidate import Candidate, baseline_candidate
from athanor.evaluate import Evaluator
from athanor.loop import CompileConfig, compile_session
from athanor.serve.launch import free_port
from athanor.store import open_store

pytestmark = [pytest.mark.slow, pytest.mark.timing]  # a compile whose verdicts rest on measured speed: run alone

PLANTED = "<script>window.__planted = 1; alert('planted')</script>"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"]


def _chromium() -> str:
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    if path is None:
        message = "Debian's chromium is not installed (apt-get install chromium)"
        if os.environ.get("CI"):
            pytest.fail(message + ": CI must run the browser tests")
        pytest.skip(message)
    pytest.importorskip("playwright", reason="the test extra's playwright is not installed")
    return path


@pytest.fixture
def dashboard(tmp_path: Path) -> Iterator[Callable[[Path], str]]:
    procs: list[subprocess.Popen[bytes]] = []

    def start(store: Path) -> str:
        port = free_port()
        procs.append(subprocess.Popen([sys.executable, "-m", "athanor", "dashboard", "--store", str(store),
                                       "--port", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT))
        url = f"http://127.0.0.1:{port}"
        for _ in range(200):
            try:
                if httpx.get(url, timeout=1).status_code == 200:
                    return url
            except httpx.HTTPError:
                time.sleep(0.1)
        raise AssertionError("the dashboard did not come up")

    yield start
    for proc in procs:
        proc.terminate()
        proc.wait(timeout=10)


def _refused(out: Path, config: CompileConfig, run_id: str) -> str:
    """A candidate with wrong logits, evaluated for real and recorded in the run with planted markup."""
    base = baseline_candidate()
    wrong = Candidate.from_source(base.source + "\n\n_reference_build = build\ndef build(model, ctx):\n"
                                 "    forward = _reference_build(model, ctx)\n    decode = forward.decode\n"
                                 "    forward.decode = lambda batch: decode(batch) * 1.01\n    return forward\n",
                                 author="llm", description="scaled logits " + PLANTED)
    evaluator = Evaluator(config.evaluate_config("fast"))
    try:
        verdict = evaluator.evaluate(wrong, base)
    finally:
        evaluator.close()
    assert not verdict.accepted and verdict.stage == "correctness", verdict
    with open_store(out) as store:
        store.add_candidate(run_id, wrong.source, parent_id=base.id, author="llm", description=wrong.manifest.description)
        store.record_verdict(run_id, verdict.to_dict(), tier="fast")
        store.post(run_id, "llm", "warning", "a post " + PLANTED, candidate_id=wrong.id)
    return wrong.id


def test_the_dashboard_in_a_browser_over_a_real_compile(tmp_path: Path, dashboard: Callable[[Path], str],
                                                        write_slow_candidate: Callable[[Path], Candidate]) -> None:
    chromium = _chromium()
    from playwright.sync_api import sync_playwright

    write_slow_candidate(tmp_path / "incumbent")  # twice as slow as the reference: a winner is certain
    out = tmp_path / "run"
    config = CompileConfig(model="tiny-dense", traffic="preset:chat", budget_s=60.0, out_dir=out, max_seqs=8,
                           max_seq_len=256, confirm_reserve_s=10.0, incumbent=tmp_path / "incumbent")
    done: list[object] = []
    events: list[str] = []
    compiling = threading.Thread(target=lambda: done.append(compile_session(config, on_event=events.append)))
    compiling.start()
    shots = tmp_path / "screenshots"
    shots.mkdir()
    try:
        for _ in range(600):
            if (out / "athanor.db").is_file() and open_store(out).runs():
                break
            time.sleep(0.1)
        run_id = open_store(out).runs()[0].id
        url = dashboard(out)
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            dialogs: list[str] = []
            page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
            page.goto(f"{url}/runs/{run_id}")
            page.evaluate("window.__same_document = true")
            before = page.locator("#verdicts tbody tr").count()
            # The compile writes verdicts as it goes: the open page shows them without being reloaded.
            # (Polled from here: the page's CSP forbids the string evaluation Playwright's wait_for_function uses.)
            deadline = time.monotonic() + 120
            while page.locator("#verdicts tbody tr").count() <= before and time.monotonic() < deadline:
                page.wait_for_timeout(250)
            assert page.locator("#verdicts tbody tr").count() > before, "no verdict appeared on the open page"
            assert page.evaluate("window.__same_document === true"), "the page was reloaded"
            page.screenshot(path=str(shots / "run-live.png"), full_page=True)
            compiling.join(timeout=300)
            assert done, "the compile did not finish"
            winner = getattr(done[0], "winner_id", None)
            assert winner, "the compile found no winner:\n" + "\n".join(events)
            refused = _refused(out, config, run_id)

            page.goto(url)
            assert run_id in page.inner_text("main")
            page.screenshot(path=str(shots / "runs.png"), full_page=True)
            page.goto(f"{url}/runs/{run_id}")
            board = page.inner_text("#leaderboard")
            assert winner in board and "[" in board  # the winner, with its interval
            verdicts = page.inner_text("#verdicts")
            assert refused in verdicts and "correctness" in verdicts
            assert PLANTED in page.inner_text("main")  # the description and the post, as text
            page.screenshot(path=str(shots / "run.png"), full_page=True)
            page.goto(f"{url}/runs/{run_id}/candidates/{refused}")
            text = page.inner_text("main")
            assert "correctness" in text and PLANTED in text and "decode(batch) * 1.01" in text  # reason, diff
            page.screenshot(path=str(shots / "candidate-refused.png"), full_page=True)
            page.goto(f"{url}/runs/{run_id}/candidates/{winner}")
            assert "accepted" in page.inner_text("main")
            page.screenshot(path=str(shots / "candidate-winner.png"), full_page=True)
            for name in ("deployments", "traffic"):
                page.goto(f"{url}/{name}")
                assert page.locator("main h1").count() == 1
                page.screenshot(path=str(shots / f"{name}.png"), full_page=True)
            assert not dialogs and not page.evaluate("window.__planted === 1"), "planted markup ran"
            browser.close()
    finally:
        compiling.join(timeout=300)
    print(f"screenshots: {shots}")
    assert len(list(shots.glob("*.png"))) == 7
