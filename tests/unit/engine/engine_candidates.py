"""Candidate sources and the engine config shared by the engine tests."""

from __future__ import annotations

from athanor.engine.candidate import Candidate, baseline_candidate
from athanor.engine.config import EngineConfig

CONFIG = EngineConfig(model="tiny-dense", max_seqs=4, max_seq_len=64, buckets=(1, 2, 4), cpu_threads=1)


def patched(body: str, description: str = "") -> Candidate:
    """The baseline with `body` appended (it may redefine `build`)."""
    return Candidate.from_source(baseline_candidate().source + "\n\n" + body, description=description)


CONSTANT_DECODE = patched(
    "_reference_build = build\n"
    "def build(model, ctx):\n"
    "    forward = _reference_build(model, ctx)\n"
    "    decode = forward.decode\n"
    "    forward.decode = lambda batch: decode(batch) * 0 + torch.arange(model.spec.vocab_size,\n"
    "                                                                    dtype=ctx.dtype, device=ctx.device)\n"
    "    return forward\n",
    "decode always prefers the last token id",
)
