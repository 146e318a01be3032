"""Sampling inside the step: greedy is argmax, seeded draws repeat, top-p cuts the tail."""

from __future__ import annotations

import torch

from athanor.model.sampling import sample


def _rows(n: int, temperature: float, top_p: float, seed: int = 0) -> tuple[torch.Tensor, ...]:
    return (torch.full((n,), temperature), torch.full((n,), top_p), torch.arange(n) + seed,
            torch.arange(n))


def test_greedy_is_argmax() -> None:
    logits = torch.randn(5, 100)
    assert torch.equal(sample(logits, *_rows(5, 0.0, 1.0)), logits.argmax(-1))


def test_seeded_sampling_repeats_and_differs_by_seed() -> None:
    logits = torch.zeros(64, 1000)
    a = sample(logits, *_rows(64, 1.0, 1.0, seed=1))
    assert torch.equal(a, sample(logits, *_rows(64, 1.0, 1.0, seed=1)))
    assert not torch.equal(a, sample(logits, *_rows(64, 1.0, 1.0, seed=2)))


def test_distribution_and_top_p() -> None:
    probs = torch.tensor([0.5, 0.3, 0.2])
    logits = probs.log().expand(4000, 3)
    temperature, top_p, seeds, positions = _rows(4000, 1.0, 1.0)
    counts = torch.bincount(sample(logits, temperature, top_p, seeds, positions), minlength=3).float() / 4000
    assert torch.allclose(counts, probs, atol=0.03)
    cut = sample(logits, temperature, torch.full((4000,), 0.6), seeds, positions)
    assert set(cut.tolist()) == {0, 1}  # 0.5 + 0.3 reaches 0.6; 0.2 is cut
