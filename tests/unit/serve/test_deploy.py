"""Admin deploys under load: a good candidate goes live with no failed request, a bad one is rolled back."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import httpx
from openai import AsyncOpenAI

from athanor.store import open_store
from conftest import MODEL, Server


def _deploy_under_load(server: Server, candidate: Path) -> tuple[dict[str, Any], list[str], int]:
    """Deploy `candidate` while 6 clients send requests; (final deployment, failures, requests done)."""
    failures: list[str] = []
    done = 0

    async def client_loop(c: AsyncOpenAI, k: int, stop: asyncio.Event) -> None:
        nonlocal done
        i = 0
        while not stop.is_set() or i < 2:
            i += 1
            try:
                if k % 2:
                    stream = await c.completions.create(model=MODEL, prompt=f"Item {k}.{i}: the", max_tokens=12,
                                                        temperature=0.7, seed=i, stream=True)
                    text = "".join([ch.choices[0].text async for ch in stream if ch.choices])
                else:
                    r = await c.chat.completions.create(model=MODEL, max_tokens=12, temperature=0,
                                                        messages=[{"role": "user", "content": f"Count to {i}"}])
                    text = r.choices[0].message.content or ""
                assert isinstance(text, str)
                done += 1
            except Exception as e:
                failures.append(repr(e))

    async def run() -> dict[str, Any]:
        c = AsyncOpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=120)
        stop = asyncio.Event()
        load = [asyncio.create_task(client_loop(c, k, stop)) for k in range(6)]
        async with httpx.AsyncClient(base_url=server.url, headers=server.admin, timeout=30) as admin:
            await asyncio.sleep(1.0)
            r = await admin.post("/admin/deploy", json={"candidate_dir": str(candidate)})
            assert r.status_code == 202, r.text
            dep = r.json()["deployment"]
            deadline = time.monotonic() + 120
            while dep["phase"] not in ("deployed", "rolled_back", "failed") and time.monotonic() < deadline:
                await asyncio.sleep(0.3)
                dep = (await admin.get(f"/admin/deployments/{dep['id']}")).json()["deployment"]
        stop.set()
        await asyncio.gather(*load)
        return dict(dep)

    dep = asyncio.run(run())
    return dep, failures, done


def test_swap_under_load_loses_no_request(server: Server, good_candidate: Path) -> None:
    before = httpx.get(f"{server.url}/health").json()["candidate"]
    dep, failures, done = _deploy_under_load(server, good_candidate)
    assert failures == []
    assert done >= 12
    assert dep["phase"] == "deployed", dep
    assert dep["figures"]["shadow_rows"] > 0 and dep["figures"]["mean_kl"] < 1e-3
    after = httpx.get(f"{server.url}/health").json()["candidate"]
    assert after == dep["candidate_id"] != before
    assert f'athanor_current_candidate{{candidate="{after}"}} 1.0' in httpx.get(f"{server.url}/metrics").text
    with open_store(server.store_path) as store:
        live = next(d for d in store.deployments() if d.candidate_id == after and d.status == "live")
    # The canary's phases and comparisons, recorded as they came (the dashboard's deployments page).
    assert [p["phase"] for p in live.details["phases"]] == ["pending", "building", "shadow", "live", "deployed"]
    assert live.details["figures"]["shadow_rows"] > 0


def test_bad_candidate_is_rolled_back(server: Server, bad_candidate: Path) -> None:
    before = httpx.get(f"{server.url}/health").json()["candidate"]
    dep, failures, _ = _deploy_under_load(server, bad_candidate)
    assert failures == []
    assert dep["phase"] == "rolled_back" and "logit mismatch" in dep["reason"], dep
    assert httpx.get(f"{server.url}/health").json()["candidate"] == before
    history = httpx.get(f"{server.url}/admin/deployments", headers=server.admin).json()["data"]
    assert [d["phase"] for d in history][-2:] == ["deployed", "rolled_back"]
    with open_store(server.store_path) as store:
        rolled = store.deployments()[0]
    assert rolled.status == "rolled_back" and "logit mismatch" in rolled.reason
    assert rolled.details["phases"][-1]["phase"] == "rolled_back"


def test_a_deploy_that_cannot_build_fails_visibly_and_the_incumbent_serves(server: Server,
                                                                          broken_candidate: Path) -> None:
    before = httpx.get(f"{server.url}/health").json()["candidate"]
    dep, failures, _ = _deploy_under_load(server, broken_candidate)
    assert failures == []
    assert dep["phase"] == "failed" and "did not build" in dep["reason"], dep
    assert "planted: this candidate cannot build" in dep["reason"]
    assert httpx.get(f"{server.url}/health").json()["candidate"] == before
    history = httpx.get(f"{server.url}/admin/deployments", headers=server.admin).json()["data"]
    assert history[-1]["phase"] == "failed" and history[-1]["candidate_id"] == dep["candidate_id"]
    assert 'athanor_deployments_total{outcome="failed"} 1.0' in httpx.get(f"{server.url}/metrics").text
