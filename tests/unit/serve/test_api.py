"""The OpenAI-compatible API through the `openai` client, the request log, metrics and bad input."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest
from openai import AsyncOpenAI, OpenAI

from athanor.traffic import read_columns
from conftest import MODEL, Server

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


def client(server: Server) -> OpenAI:
    return OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=120)


def test_chat_answers_paris(server: Server) -> None:
    reply = client(server).chat.completions.create(model=MODEL, messages=QUESTION, temperature=0, max_tokens=24)
    assert "Paris" in (reply.choices[0].message.content or "")
    assert reply.usage is not None and reply.usage.completion_tokens > 0


def test_chat_streams_paris(server: Server) -> None:
    stream = client(server).chat.completions.create(model=MODEL, messages=QUESTION, temperature=0, max_tokens=24,
                                                    stream=True)
    pieces, finish = [], None
    for chunk in stream:
        if chunk.choices:
            pieces.append(chunk.choices[0].delta.content or "")
            finish = chunk.choices[0].finish_reason or finish
    assert len([p for p in pieces if p]) > 1, "the answer came in one piece: not streamed"
    assert "Paris" in "".join(pieces) and finish in ("stop", "length")


def test_completions_stop_string_and_token_prompt(server: Server) -> None:
    c = client(server)
    assert [m.id for m in c.models.list().data] == [MODEL]
    full = c.completions.create(model=MODEL, prompt="The capital of France is", temperature=0, max_tokens=12)
    text = full.choices[0].text
    assert "Paris" in text
    cut = c.completions.create(model=MODEL, prompt="The capital of France is", temperature=0, max_tokens=12,
                               stop=["Paris"])
    assert cut.choices[0].text == text[:text.index("Paris")] and cut.choices[0].finish_reason == "stop"
    ids = c.completions.create(model=MODEL, prompt=[504, 3575, 282, 4649, 314], temperature=0, max_tokens=4)
    assert ids.usage is not None and ids.usage.prompt_tokens == 5
    # A seed makes a sampled answer repeatable.
    a, b = (c.completions.create(model=MODEL, prompt="Once upon a time", temperature=1.0, seed=7, max_tokens=10)
            for _ in range(2))
    assert a.choices[0].text == b.choices[0].text


def test_concurrent_requests_are_batched(server: Server) -> None:
    async def run() -> list[int]:
        c = AsyncOpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=120)
        replies = await asyncio.gather(*(c.completions.create(model=MODEL, prompt=f"Story number {i}:",
                                                              max_tokens=16, temperature=0.8, seed=i)
                                         for i in range(8)))
        return [r.usage.completion_tokens for r in replies if r.usage]

    assert len(asyncio.run(run())) == 8
    metrics = httpx.get(f"{server.url}/metrics").text
    largest = next(float(line.split()[-1]) for line in metrics.splitlines()
                   if line.startswith("athanor_max_batch_size"))
    assert largest > 1, "eight concurrent requests never shared a decode step"
    for name in ("athanor_time_to_first_token_seconds_count", "athanor_queue_length", "athanor_current_candidate",
                 "athanor_generation_tokens_per_second", "athanor_time_per_output_token_seconds_count"):
        assert name in metrics


def test_a_long_prompt_counts_every_chunk_in_the_step_metrics(server: Server) -> None:
    from athanor.bench.serve import _server_counters

    # 400 prompt tokens at the CPU's 256 a step: a first chunk that samples no token, then the rest.
    prompt = [(7 * i) % 1000 + 10 for i in range(400)]
    before = asyncio.run(_server_counters(server.url))
    reply = OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0).completions.create(
        model=MODEL, prompt=prompt, max_tokens=3, temperature=0, extra_body={"ignore_eos": True})
    assert reply.usage is not None and reply.usage.completion_tokens == 3
    after = asyncio.run(_server_counters(server.url))

    def grew(key: str) -> float:
        return after.get(key, 0.0) - before.get(key, 0.0)

    assert grew("prefill") == 400  # (any prefix cached by earlier tests is no hit: these ids are new)
    assert grew("prefill.prefill") == 400 and grew("steps.prefill") == 2
    assert grew("steps.decode") == 2 and grew("seconds.decode") > 0


def test_request_log_is_a_trace(server: Server) -> None:
    client(server).completions.create(model=MODEL, prompt="Logged request", max_tokens=3, temperature=0)
    lines = [json.loads(x) for x in server.log_path.read_text().splitlines()]
    assert lines and all("prompt" not in r for r in lines), "prompt text must not be logged by default"
    last = lines[-1]
    assert last["input_length"] > 0 and last["ttft_s"] > 0 and last["latency_s"] >= last["ttft_s"]
    assert len(last["hash_ids"]) == -(-last["input_length"] // 512)
    trace = read_columns(server.log_path)  # traffic/ reads it back as the "athanor" format
    assert len(trace) == len(lines)


BAD = [
    ("post", "/v1/chat/completions", b"{not json", 400, "invalid_json"),
    ("post", "/v1/completions", b"[1, 2]", 400, "invalid_json"),
    ("post", "/v1/chat/completions", json.dumps({"model": "gpt-9", "messages": QUESTION}).encode(), 404,
     "model_not_found"),
    ("post", "/v1/completions", json.dumps({"model": MODEL, "prompt": "word " * 600}).encode(), 400,
     "context_length_exceeded"),
    ("post", "/v1/completions", json.dumps({"model": MODEL, "prompt": "hi", "max_tokens": -5}).encode(), 400, None),
    ("post", "/v1/completions", json.dumps({"model": MODEL, "prompt": "hi", "max_tokens": 10**9}).encode(), 400,
     "context_length_exceeded"),
    ("post", "/v1/chat/completions", json.dumps({"model": MODEL, "messages": []}).encode(), 400, None),
    ("post", "/v1/completions", json.dumps({"model": MODEL, "prompt": "hi", "temperature": -1}).encode(), 400, None),
    # Fields of the API athanor does not implement are refused by name, not ignored.
    ("post", "/v1/chat/completions", json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "hi"}],
                                                 "logprobs": True}).encode(), 400, "unsupported_field"),
    ("post", "/v1/completions", json.dumps({"model": MODEL, "prompt": "hi", "n": 2}).encode(), 400,
     "unsupported_field"),
    ("post", "/v1/chat/completions", json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "hi"}],
                                                 "response_format": {"type": "json_object"}}).encode(), 400,
     "unsupported_field"),
    ("post", "/admin/deploy", json.dumps({"candidate_dir": "/nonexistent"}).encode(), 401, "missing_token"),
    ("get", "/admin/deployments", b"", 401, "missing_token"),
]


@pytest.mark.parametrize(("method", "path", "body", "status", "code"), BAD)
def test_bad_input_gets_an_openai_error(server: Server, method: str, path: str, body: bytes, status: int,
                                        code: str | None) -> None:
    r = httpx.request(method.upper(), f"{server.url}{path}", content=body or None,
                      headers={"content-type": "application/json"}, timeout=30)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert err["message"] and err["type"]
    if code:
        assert err["code"] == code


def test_wrong_admin_token_and_bad_candidate_dir(server: Server) -> None:
    wrong = httpx.get(f"{server.url}/admin/deployments", headers={"Authorization": "Bearer nope"})
    assert wrong.status_code == 401 and wrong.json()["error"]["code"] == "invalid_token"
    missing = httpx.post(f"{server.url}/admin/deploy", json={"candidate_dir": str(server.work / "nothing")},
                         headers=server.admin)
    assert missing.status_code == 400 and "candidate.py" in missing.json()["error"]["message"]


def test_server_keeps_serving_after_bad_input(server: Server) -> None:
    for _ in range(3):
        httpx.post(f"{server.url}/v1/completions", content=b"{{{")
    reply = client(server).completions.create(model=MODEL, prompt="The capital of France is", temperature=0,
                                              max_tokens=4)
    assert "Paris" in reply.choices[0].text
    assert httpx.get(f"{server.url}/health").json()["status"] == "ok"
