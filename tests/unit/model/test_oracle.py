"""The oracle: our reference forward against HF transformers on the real embedded model.

HF reads the same GGUF through its own `gguf_file=` path, so a loader bug cannot cancel out
on both sides.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from athanor.model import BuildContext, make_prefill_batch
from athanor.model.gguf_loader import read_gguf
from athanor.model.reference import build

# Real text (the opening of the Gettysburg Address, public domain).
TEXT = (
    "Four score and seven years ago our fathers brought forth on this continent, a new nation, "
    "conceived in Liberty, and dedicated to the proposition that all men are created equal. "
    "Now we are engaged in a great civil war, testing whether that nation, or any nation so conceived "
    "and so dedicated, can long endure."
)


@pytest.fixture(scope="module")
def hf_model(smollm2_gguf: Path):
    import transformers  # a test dependency (pyproject's `test` extra): its absence is a broken install, not a skip

    model = transformers.AutoModelForCausalLM.from_pretrained(
        str(smollm2_gguf.parent), gguf_file=smollm2_gguf.name, torch_dtype=torch.float32
    )
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(smollm2_gguf.parent), gguf_file=smollm2_gguf.name)
    return model.eval(), tokenizer


def test_logits_match_hf_transformers(smollm2_gguf: Path, hf_model) -> None:
    ours, tokenizer = read_gguf(smollm2_gguf)
    hf, _ = hf_model
    ids = tokenizer.encode(TEXT)
    with torch.no_grad():
        want = hf(torch.tensor([ids])).logits[0]  # [T, V]
    ctx = BuildContext(torch.device("cpu"), torch.float32, max_seqs=1, max_seq_len=len(ids))
    bound = 1e-4 * want.abs().max().item()
    # The whole prompt in one prefill ...
    last = build(ours, ctx).prefill(make_prefill_batch([ids], [0]))[0]
    err = (last - want[-1]).abs().max().item()
    assert err <= bound, f"max |ours - HF| = {err:.3g} > {bound:.3g}"
    # ... and every position, as prefills of one token that continue the cached slot.
    fwd = build(ours, ctx)
    for n in range(len(ids)):
        got = fwd.prefill(make_prefill_batch([[ids[n]]], [0], seq_lens=[n]))[0]
        err = (got - want[n]).abs().max().item()
        assert err <= bound, f"position {n}: max |ours - HF| = {err:.3g} > {bound:.3g}"


def test_tokenizer_matches_hf_gguf_tokenizer(smollm2_gguf: Path, hf_model) -> None:
    _, ours = read_gguf(smollm2_gguf)
    _, theirs = hf_model
    samples = [TEXT, "Hello world 12345, it's 3.14!\n\tdef f(x): return x**2", "<|im_start|>user\nHi<|im_end|>",
               "Ünïcödé — 東京 🚀"]
    for s in samples:
        assert ours.encode(s) == theirs.encode(s, add_special_tokens=False), s
        assert ours.decode(ours.encode(s), skip_special=False) == s
    chat = [{"role": "user", "content": "What is the capital of France?"}]
    assert ours.apply_chat_template(chat) == theirs.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
