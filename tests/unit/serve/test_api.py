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
                                                 "logprobs": True, "stream": True}).encode(), 400,
     "unsupported_field"),
    ("post", "/v1/completions", json.dumps({"model": MODEL, "prompt": "hi", "echo": True, "logprobs": 2}).encode(),
     400, "unsupported_field"),
    ("post", "/v1/completions", json.dumps({"model": MODEL, "prompt": "hi", "best_of": 2}).encode(), 400,
     "unsupported_field"),
    ("post", "/v1/completions", json.dumps({"model": MODEL, "prompt": "hi", "n": 17}).encode(), 400, None),
    ("post", "/v1/completions", json.dumps({"model": MODEL, "prompt": "hi", "logprobs": 21}).encode(), 400, None),
    ("post", "/v1/chat/completions", json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "hi"}],
                                                 "top_logprobs": 2}).encode(), 400, None),
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


def test_n_choices_are_each_the_request_alone_with_the_next_seed(server: Server) -> None:
    from athanor.bench.serve import _server_counters

    client = OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)
    prompt = "A list of rivers, numbered, begins with the Danube and goes on"
    ask = {"model": MODEL, "max_tokens": 8, "temperature": 1.0, "extra_body": {"ignore_eos": True}}
    before = asyncio.run(_server_counters(server.url))
    many = client.completions.create(prompt=prompt, n=3, seed=40, **ask)
    after = asyncio.run(_server_counters(server.url))
    alone = [client.completions.create(prompt=prompt, seed=40 + i, **ask).choices[0].text for i in range(3)]
    assert [c.index for c in many.choices] == [0, 1, 2]
    assert [c.text for c in many.choices] == alone and len(set(alone)) > 1
    assert many.usage is not None and many.usage.completion_tokens == 24
    # The prompt's pages were computed once: the other choices computed only what follows its last full page.
    n_prompt = many.usage.prompt_tokens
    computed = after["prefill"] - before["prefill"]
    assert computed <= n_prompt + 2 * 16, (computed, n_prompt)

    chat = client.chat.completions.create(model=MODEL, messages=QUESTION, n=2, max_tokens=6, temperature=0,
                                          stream=True)
    texts, finished = ["", ""], []
    for chunk in chat:
        for c in chunk.choices:
            texts[c.index] += c.delta.content or ""
            if c.finish_reason:
                finished.append(c.index)
    assert sorted(finished) == [0, 1] and texts[0] == texts[1] != ""  # greedy: alike


def test_logprobs_are_the_models_log_softmax(server: Server, smollm2) -> None:
    import torch

    from athanor.model import BuildContext, make_prefill_batch
    from athanor.model.reference import build

    model, tokenizer = smollm2
    client = OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)
    prompt = tokenizer.encode("The capital of France is")
    r = client.completions.create(model=MODEL, prompt=prompt, max_tokens=5, temperature=0.7, seed=1, logprobs=3,
                                  extra_body={"ignore_eos": True})
    lp = r.choices[0].logprobs
    assert lp is not None and lp.tokens and lp.token_logprobs and lp.top_logprobs and lp.text_offset is not None
    assert "".join(lp.tokens) == r.choices[0].text and lp.text_offset[0] == 0
    # The reference forward over the prompt and the sampled tokens: each token's log-probability where it was drawn.
    ids = prompt + [tokenizer.encode(t, add_bos=False)[0] for t in lp.tokens]
    fwd = build(model, BuildContext(torch.device("cpu"), torch.float32, max_seqs=1, max_seq_len=len(ids)))
    fwd.prefill(make_prefill_batch([prompt[:-1]], [0]))
    for n in range(len(prompt) - 1, len(ids) - 1):
        want = torch.log_softmax(fwd.prefill(make_prefill_batch([[ids[n]]], [0], seq_lens=[n]))[0].float(), -1)
        k = n - len(prompt) + 1
        assert abs(lp.token_logprobs[k] - want[ids[n + 1]].item()) < 1e-3
        top = sorted(lp.top_logprobs[k].values(), reverse=True)
        assert len(top) == 3 and abs(top[0] - want.max().item()) < 1e-3

    chat = client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=4, temperature=0,
                                          logprobs=True, top_logprobs=2)
    content = chat.choices[0].logprobs.content if chat.choices[0].logprobs else None
    assert content and len(content) == 4
    for token in content:  # greedy: each token is the most likely one
        assert len(token.top_logprobs) == 2 and abs(token.logprob - token.top_logprobs[0].logprob) < 1e-5
        assert bytes(token.bytes or []).decode(errors="replace") == token.token


def test_echo_returns_the_prompt_first(server: Server) -> None:
    client = OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)
    r = client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=4, temperature=0, echo=True)
    alone = client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=4, temperature=0)
    assert r.choices[0].text == "Once upon a time" + alone.choices[0].text
