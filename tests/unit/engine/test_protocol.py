"""The wire format: round trips, and what it refuses."""

from __future__ import annotations

import json

import pytest
import torch

from athanor.engine import protocol as p
from athanor.engine.candidate import Candidate


def test_round_trip_keeps_types_tensors_and_nesting() -> None:
    req = p.RunRequest("decode", torch.tensor([1, 2]), torch.tensor([3, 4]), torch.tensor([0, 1]),
                       torch.tensor([3, 4]), torch.tensor([0.0, 0.7]), torch.tensor([1.0, 0.9]),
                       torch.tensor([5, 6]), return_logits=True)
    request_id, back = p.decode([bytes(f) for f in p.encode(req, 7)])
    assert request_id == 7 and isinstance(back, p.RunRequest)
    assert torch.equal(back.tokens, req.tokens) and back.temperature.dtype == torch.float32
    swap = p.SwapRequest(Candidate.from_source("def build(m, c): ...", author="me"))
    assert p.decode(p.encode(swap, 1))[1] == swap
    bf16 = p.RunReply(logits=torch.randn(2, 3).bfloat16())
    assert torch.equal(p.decode(p.encode(bf16, 1))[1].logits, bf16.logits)


def test_unknown_types_and_versions_are_refused() -> None:
    header = json.dumps({"v": p.PROTOCOL_VERSION, "id": 1, "body": {"__type__": "os.system", "fields": {}}})
    with pytest.raises(p.ProtocolError, match="unknown message type"):
        p.decode([header.encode()])
    with pytest.raises(p.ProtocolError, match="protocol version"):
        p.decode([json.dumps({"v": 99, "id": 1, "body": None}).encode()])
    with pytest.raises(p.ProtocolError):
        p.decode([b"\x80\x04pickle"])


def test_failure_reply_has_the_request_s_reply_type() -> None:
    reply = p.failure(p.SwapRequest(Candidate.from_source("x")), "crashed", "boom")
    assert isinstance(reply, p.SwapReply) and reply.status == "crashed"
