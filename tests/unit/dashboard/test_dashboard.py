"""The dashboard over a real store (SQLite, read-only), through FastAPI's test client: every page renders what the
store holds, planted markup shows as text, nothing but GET is answered, and no asset comes from elsewhere."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from dashboard_store import PLANTED, fill_store
from fastapi.testclient import TestClient

from athanor.dashboard.app import CSP, DashboardOptions, create_app, write_pngs
from athanor.dashboard.views import open_reader
from athanor.store import open_store


@pytest.fixture(scope="module")
def filled_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return fill_store(tmp_path_factory.mktemp("dashboard"))


@pytest.fixture(scope="module")
def client(filled_store: Path) -> TestClient:
    return TestClient(create_app(DashboardOptions(str(filled_store)), open_reader(str(filled_store))))


def _run_id(filled_store: Path) -> str:
    with open_store(filled_store) as store:
        return store.runs()[0].id


def test_every_page_renders_what_the_store_holds(client: TestClient, filled_store: Path) -> None:
    run_id = _run_id(filled_store)
    home = client.get("/")
    assert home.status_code == 200 and run_id in home.text and "x1.170 [1.150, 1.190]" in home.text
    run = client.get(f"/runs/{run_id}").text
    leaderboard = run.split('id="leaderboard"')[1].split("</table>")[0]
    assert "x1.190 [1.166, 1.214]" in leaderboard  # the fast tier's accepted verdict and its interval
    assert "correctness" in run and "max |logit error| 3.1" in run  # the refused one, with its stage and reason
    assert "<svg" in run and "variant" in run and "llm" in run  # charts; the agents' table
    winner = re.search(r"candidates/([0-9a-f]{16})\">\1</a> x1\.170", run)
    assert winner, "the verified winner links to its page"
    cand = client.get(f"/runs/{run_id}/candidates/{winner.group(1)}").text
    assert "fused_qkv" in cand and 'class="add"' in cand  # its moves and its diff against the parent
    assert "decode" in cand and "prefill" in cand and "roofline" in cand  # timings per shape
    deployments = client.get("/deployments").text
    assert "rolled_back" in deployments and "shadow" in deployments and "mean_kl" in deployments
    traffic = client.get("/traffic").text
    assert "input_length" in traffic and "deployed" in traffic and traffic.count("<svg") == 3


def test_store_text_is_shown_escaped(client: TestClient, filled_store: Path) -> None:
    run_id = _run_id(filled_store)
    pages = [client.get(p).text for p in ("/", f"/runs/{run_id}", "/deployments")]
    joined = "".join(pages)
    assert PLANTED not in joined
    shown = "&lt;script&gt;alert("  # the planted text, as text
    assert pages[1].count(shown) >= 3 and shown in pages[2]  # description, reason, post; the rollback's reason
    assert "<script>" not in joined.replace('<script src="/static/live.js" defer></script>', "")


def test_only_get_is_answered_and_nothing_comes_from_elsewhere(client: TestClient) -> None:
    for method in ("POST", "PUT", "DELETE", "PATCH"):
        assert client.request(method, "/").status_code == 405
    r = client.get("/")
    assert r.headers["content-security-policy"] == CSP and "'unsafe-inline'" not in CSP
    assert not re.search(r'(src|href)="(https?:)?//', r.text)  # every asset from this server
    assert client.get("/static/live.js").status_code == 200 and client.get("/static/../app.py").status_code == 404
    assert client.get("/runs/nope").status_code == 404


def test_a_fragment_is_the_page_without_its_frame(client: TestClient) -> None:
    full, fragment = client.get("/traffic").text, client.get("/traffic?fragment=1").text
    assert "<html" in full and "<html" not in fragment and "Drift timeline" in fragment


def test_the_store_is_opened_read_only(filled_store: Path) -> None:
    reader = open_reader(str(filled_store))
    with pytest.raises(Exception, match="readonly"):
        reader.add_run("m", "t", "cpu")


def test_figures_as_png(filled_store: Path, tmp_path: Path) -> None:
    paths = write_pngs(open_reader(str(filled_store)), str(tmp_path))
    names = {Path(p).name for p in paths}
    assert "traffic-input.png" in names and any(n.endswith("-speedup.png") for n in names)
    assert all(Path(p).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for p in paths)
