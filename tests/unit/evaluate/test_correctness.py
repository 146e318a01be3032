"""The dtype tolerance of `compare`: a bound on the bulk of the logits, with a thin tail allowed."""

from __future__ import annotations

import torch

from athanor.engine.protocol import TrajectoryReply
from athanor.engine.trajectory import fingerprint, fingerprint_projection
from athanor.evaluate.correctness import OUTLIER_SHARE, compare

ROWS, VOCAB = 64, 8192


def _reply(logits: torch.Tensor) -> TrajectoryReply:
    feats, argmax = fingerprint(logits, fingerprint_projection(VOCAB, 8, 0, torch.device("cpu")), None)
    return TrajectoryReply(fingerprints=feats[None], tokens=argmax[None], logits=logits[None])


def _reference() -> torch.Tensor:
    gen = torch.Generator().manual_seed(0)
    ref = torch.randn(ROWS, VOCAB, generator=gen) * 0.5
    ref[:, 0] = 8.0  # a clear argmax on every row: greedy agreement is not what these tests probe
    return ref


def test_rounding_noise_with_a_thin_tail_past_the_tolerance_is_admitted() -> None:
    ref = _reference()
    cand = ref + torch.randn(ROWS, VOCAB, generator=torch.Generator().manual_seed(1)) * 0.02
    flat = cand.view(-1)
    tail = int(OUTLIER_SHARE * flat.numel())
    assert tail >= 3
    flat[1:1 + tail] = ref.view(-1)[1:1 + tail] + 0.11  # past atol 0.1 + rtol 0.02 |r| where |r| < 0.5
    got = compare(_reply(cand), _reply(ref), 0, torch.bfloat16)
    assert got.ok, got.reason


def test_a_wider_tail_or_one_value_past_twice_the_tolerance_is_refused() -> None:
    ref = _reference()
    wide = ref.clone()
    n = int(OUTLIER_SHARE * wide.numel()) + 1
    wide.view(-1)[1:1 + n] += 0.15  # each within twice the tolerance (>= 0.2), but too many
    got = compare(_reply(wide), _reply(ref), 0, torch.bfloat16)
    assert not got.ok and f"{n} values beyond it" in got.reason
    far = ref.clone()
    far[5, 100] += 0.5  # one value, but past twice the tolerance
    got = compare(_reply(far), _reply(ref), 0, torch.bfloat16)
    assert not got.ok and "1 values beyond it" in got.reason


def test_fp32_tolerance_is_unchanged_for_the_bulk() -> None:
    ref = _reference()
    cand = ref + 5e-3  # every value past fp32's 1e-3 + 1e-3 |r|
    assert not compare(_reply(cand), _reply(ref), 0, torch.float32).ok
