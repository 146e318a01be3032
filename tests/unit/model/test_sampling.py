"""Sampling: greedy rows, top-p truncation, per-row seeds."""

from __future__ import annotations

import torch

from athanor.model.sampling import exponential_noise, sample


def test_greedy_rows_take_the_argmax_and_sampled_rows_follow_top_p() -> None:
    logits = torch.tensor([[0.0, 3.0, 1.0, 2.9], [0.0, 3.0, 1.0, 2.9]])
    counts = torch.zeros(4)
    for seed in range(400):
        gens = [torch.Generator().manual_seed(seed)] * 2
        noise = exponential_noise((2, 4), gens, torch.device("cpu"))
        out = sample(logits, torch.tensor([0.0, 1.0]), torch.tensor([1.0, 0.6]), noise)
        assert out[0] == 1
        counts[out[1]] += 1
    # top_p 0.6 keeps tokens 1 and 3 only (together ~0.9 of the mass; 1 alone ~0.47 < 0.6).
    assert counts[0] == 0 and counts[2] == 0 and counts[1] > 100 and counts[3] > 100


def test_same_seed_same_tokens() -> None:
    logits = torch.randn(3, 50)
    draw = lambda s: sample(logits, torch.ones(3), torch.ones(3),  # noqa: E731
                            exponential_noise((3, 50), [torch.Generator().manual_seed(s)] * 3, torch.device("cpu")))
    assert torch.equal(draw(5), draw(5))
    assert any(not torch.equal(draw(5), draw(s)) for s in range(6, 12))
