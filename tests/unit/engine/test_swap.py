"""Swapping through a real worker: outputs follow the candidate, failures keep the incumbent."""

from __future__ import annotations

import json

import torch
import zmq
from engine_candidates import CONFIG, CONSTANT_DECODE, patched

from athanor.engine import auth
from athanor.engine import protocol as p
from athanor.engine.candidate import Candidate, baseline_candidate
from athanor.engine.supervisor import Supervisor
from athanor.model import BuildContext, make_prefill_batch
from athanor.model.presets import get_preset
from athanor.model.random_init import random_model
from athanor.model.reference import build as reference_build

PROMPTS = [[1, 2, 3, 4], [7, 8]]


def test_prefill_and_decode_match_the_reference_in_process(fresh: Supervisor) -> None:
    model = random_model(get_preset("tiny-dense"), seed=0)
    ctx = BuildContext(torch.device("cpu"), torch.float32, CONFIG.max_seqs, CONFIG.max_seq_len)
    ref = reference_build(model, ctx)
    want = ref.prefill(make_prefill_batch(PROMPTS, [0, 1]))
    got = fresh.prefill(PROMPTS, [0, 1], return_logits=True)
    assert got.status == "ok", got.error
    assert got.logits is not None and torch.allclose(got.logits, want, atol=1e-5)
    # A continued prefill of slot 0 and a decode step agree with the reference too.
    want = ref.prefill(make_prefill_batch([[5, 6]], [0], [4]))
    got = fresh.prefill([[5, 6]], [0], [4], return_logits=True)
    assert got.logits is not None and torch.allclose(got.logits, want, atol=1e-5)


def test_swap_changes_outputs_as_the_candidate_says(fresh: Supervisor) -> None:
    before = fresh.generate(PROMPTS, 6)
    reply = fresh.swap(CONSTANT_DECODE)
    assert reply.status == "ok", reply.error
    after = fresh.generate(PROMPTS, 6)
    vocab = get_preset("tiny-dense").vocab_size
    # Prefill is the reference's, every decoded token is the candidate's constant choice.
    assert [row[0] for row in after.tokens] == [row[0] for row in before.tokens]
    assert all(t == vocab - 1 for row in after.tokens for t in row[1:])
    assert fresh.swap(baseline_candidate()).status == "ok"
    assert fresh.generate(PROMPTS, 6).tokens == before.tokens


def test_two_residents_switch_without_rebuilding(fresh: Supervisor) -> None:
    base = baseline_candidate().id
    assert fresh.swap(CONSTANT_DECODE, keep_incumbent=True).status == "ok"
    assert set(fresh.stats().resident) == {base, CONSTANT_DECODE.id}
    a = fresh.generate(PROMPTS, 3, candidate_id=base)
    b = fresh.generate(PROMPTS, 3)
    assert a.tokens != b.tokens
    assert fresh.activate(base).status == "ok" and fresh.health().active_candidate == base
    assert fresh.drop(CONSTANT_DECODE.id).status == "ok"
    assert fresh.stats().resident == (base,)


def test_raising_candidates_keep_the_incumbent(fresh: Supervisor) -> None:
    incumbent = fresh.health().active_candidate
    raising_build = patched("def build(model, ctx):\n    raise RuntimeError('no fusion today')\n")
    reply = fresh.swap(raising_build)
    assert reply.status == "error" and "no fusion today" in reply.error
    raising_decode = patched(
        "_reference_build = build\n"
        "def build(model, ctx):\n"
        "    forward = _reference_build(model, ctx)\n"
        "    def decode(batch):\n"
        "        raise ValueError('decode exploded')\n"
        "    forward.decode = decode\n"
        "    return forward\n")
    reply = fresh.swap(raising_decode)  # the swap's first step runs decode
    assert reply.status == "error" and "decode exploded" in reply.error
    assert fresh.health().active_candidate == incumbent
    assert fresh.generate(PROMPTS, 2).status == "ok"


def test_a_forward_that_raises_at_run_time_returns_the_error(fresh: Supervisor) -> None:
    late = patched(
        "_reference_build = build\n"
        "def build(model, ctx):\n"
        "    forward = _reference_build(model, ctx)\n"
        "    def prefill(batch):\n"
        "        raise ValueError('prefill exploded')\n"
        "    forward.prefill = prefill\n"
        "    return forward\n")
    assert fresh.swap(late).status == "ok"
    reply = fresh.prefill(PROMPTS, [0, 1])
    assert reply.status == "error" and "prefill exploded" in reply.error
    assert fresh.decode([1], [0], [0]).status == "ok"


def test_bad_candidates_get_clear_errors(fresh: Supervisor) -> None:
    cases = {
        "def build(model, ctx:\n": "does not parse",
        "SEAM_VERSION = 2\nx = 1\n": "defines no function build",
        "SEAM_VERSION = 2\ndef build(model, ctx):\n    return 42\n": "no prefill() method",
        "def build(model, ctx):\n    return 42\n": "follows candidate seam 1; this athanor builds seam 2",
        patched("_b = build\ndef build(model, ctx):\n    f = _b(model, ctx)\n"
                "    f.decode = lambda batch: 'logits'\n    return f\n").source: "expected a Tensor",
    }
    for source, message in cases.items():
        reply = fresh.swap(Candidate.from_source(source))
        assert reply.status == "error" and message in reply.error, (message, reply.error)
    assert fresh.health().active_candidate == baseline_candidate().id


def test_bad_requests_are_refused_and_the_engine_keeps_running(fresh: Supervisor) -> None:
    assert "slot 9 is out of range" in fresh.decode([1], [0], [9]).error
    assert fresh.decode([1, 2], [0, 0], [1, 1]).status == "invalid"  # a slot twice
    assert "positions" in fresh.decode([1], [CONFIG.max_seq_len], [0]).error
    assert fresh.decode([10**6], [0], [0]).status == "invalid"
    assert fresh.generate([[1] * 70], 2).status == "invalid"
    forged = Candidate("x = 1\n", baseline_candidate().manifest)
    assert fresh.swap(forged).status == "invalid"

    # An RPC the worker does not know, and a frame that is not a message at all, from a raw socket.
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.connect(f"ipc://{fresh.socket_path}")
    try:
        header = {"v": p.PROTOCOL_VERSION, "id": 5, "body": {"__type__": "LaunchMissiles", "fields": {}}}
        for frame, message in ((json.dumps(header).encode(), "unknown RPC 'LaunchMissiles'"),
                               (b"not json", "not JSON")):
            sock.send_multipart(auth.sign(fresh.client_key, [frame]))
            assert sock.poll(10_000)
            _, reply = p.decode(sock.recv_multipart())
            assert reply.status == "invalid" and message in reply.error, reply
    finally:
        sock.close(linger=0)
    assert fresh.health().status == "ok"


def test_memory_after_100_swaps(fresh: Supervisor) -> None:
    other = patched("# a different candidate, the same forward\n")
    pair = [baseline_candidate(), other]
    for i in range(10):  # warm the allocator before taking the baseline figure
        assert fresh.swap(pair[i % 2]).status == "ok"
    before = fresh.stats().rss_bytes
    for i in range(100):
        assert fresh.swap(pair[i % 2]).status == "ok"
    after = fresh.stats()
    assert after.resident == (pair[1].id,)
    assert after.rss_bytes < before * 1.02, (before, after.rss_bytes)
