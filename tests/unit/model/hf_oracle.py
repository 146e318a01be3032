"""The tests' oracle for a model HF and athanor both load: HF's logits over a prefill and decode steps, against the
reference forward's."""

from __future__ import annotations

import torch

from athanor.model import BuildContext, DecodeBatch, make_prefill_batch
from athanor.model.reference import build


def assert_matches_hf(hf, model) -> None:  # type: ignore[no-untyped-def]
    """Prefill (two sequences at once, the long one in two chunks past the window) and decode steps past it."""
    gen = torch.Generator().manual_seed(1)
    long, short = torch.randint(0, 128, (24,), generator=gen), torch.randint(0, 128, (9,), generator=gen)
    with torch.no_grad():
        want_long, want_short = hf(long[None]).logits[0], hf(short[None]).logits[0]
        fwd = build(model, BuildContext(torch.device("cpu"), torch.float32, max_seqs=2, max_seq_len=32))
        first = fwd.prefill(make_prefill_batch([long[:10].tolist(), short.tolist()], [0, 1]))
        second = fwd.prefill(make_prefill_batch([long[10:20].tolist()], [0], seq_lens=[10]))[0]
        steps = []
        for n in range(20, 24):
            pos = torch.tensor([n])
            steps.append(fwd.decode(DecodeBatch(long[n:n + 1], pos, torch.tensor([0]), pos))[0])
    bound = 1e-4 * want_long.abs().max().item()
    pairs = [(first[0], want_long[9]), (first[1], want_short[-1]), (second, want_long[19]),
             *zip(steps, want_long[20:24], strict=True)]
    err = max((got - want).abs().max().item() for got, want in pairs)
    assert err <= bound, f"max |ours - HF| = {err:.3g} > {bound:.3g}"
