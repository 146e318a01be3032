import numpy as np
import pytest

from athanor.traffic.parsers import read_columns
from athanor.traffic.profile import load_profile
from athanor.traffic.workload import replay_requests, workload_from_profile


class ByteTokenizer:
    """A real (if simple) tokenizer for tests: UTF-8 bytes."""

    def encode(self, text: str) -> list[int]:
        return list(text.encode())


def test_workload_counts_match_profile():
    p = load_profile("preset:chat")
    w = workload_from_profile(p, chunk_size=2048)
    # prefill tokens per 1000 requests ~ 1000 x mean input (no prefix sharing in chat)
    assert w.prefill_tokens == pytest.approx(1000 * p.input.mean, rel=0.1)
    assert w.decode_tokens == pytest.approx(1000 * p.output.mean, rel=0.1)
    assert sum(s.count * s.batch_size for s in w.decode) == pytest.approx(w.decode_tokens, rel=1e-6)
    assert w.mean_decode_batch() == pytest.approx(p.decode.mean_batch, rel=0.15)  # Little's law
    assert all(s.chunk_len <= 2048 for s in w.prefill)


def test_replay_shares_prefixes_as_hash_ids_say(traces):
    c = read_columns(traces / "mooncake_conversation.jsonl")
    reqs = replay_requests(c, ByteTokenizer(), num_requests=40, max_input_len=4096)
    assert len(reqs) == 40
    for r, n_in in zip(reqs, c.input_length[:40], strict=False):
        assert len(r.prompt_ids) == min(int(n_in), 4096)
    a, b = reqs[0], reqs[1]  # both start with block 0, then differ
    assert a.hash_ids[0] == b.hash_ids[0] and a.hash_ids[1] != b.hash_ids[1]
    assert a.prompt_ids[:512] == b.prompt_ids[:512] and a.prompt_ids[512:1024] != b.prompt_ids[512:1024]
    text = bytes(a.prompt_ids[:512]).decode()
    assert text.count(" ") > 50  # words, not noise


@pytest.fixture(scope="module")
def real_tokenizer(smollm2_gguf):
    """smollm2-135m's tokenizer (its GGUF fetched into the user cache once, as every test of the real model does)."""
    from athanor.model.registry import load_tokenizer

    return load_tokenizer("smollm2-135m")


def test_replay_from_profile_with_real_tokenizer(real_tokenizer):
    tok = real_tokenizer
    reqs = replay_requests(load_profile("preset:agent"), tok, num_requests=8, max_input_len=2048)
    assert all(0 <= t < tok.vocab_size for r in reqs for t in r.prompt_ids)
    assert len({r.prompt_ids[:64] for r in reqs}) < 8  # the agent preset shares system prompts
    assert np.mean([len(r.prompt_ids) for r in reqs]) > 100
    for r in reqs:  # token content decodes to real English text, not noise
        words = tok.decode(list(r.prompt_ids[:200])).split()
        assert len(words) > 60 and sum(w.strip(".,;:!?'\"").isalpha() for w in words) > 0.8 * len(words)


def test_replay_trace_with_real_tokenizer_shares_prefixes(traces, real_tokenizer):
    tok = real_tokenizer
    c = read_columns(traces / "mooncake_conversation.jsonl")
    reqs = replay_requests(c, tok, num_requests=40, max_input_len=2048)
    pairs = 0
    for a in reqs:
        for b in reqs:
            if a is b or not a.hash_ids or not b.hash_ids:
                continue
            k = 0  # leading blocks the two requests share
            while k < min(len(a.hash_ids), len(b.hash_ids)) and a.hash_ids[k] == b.hash_ids[k]:
                k += 1
            n = min(k * 512, len(a.prompt_ids), len(b.prompt_ids))
            assert a.prompt_ids[:n] == b.prompt_ids[:n]
            if k < min(len(a.hash_ids), len(b.hash_ids)) and len(a.prompt_ids) >= (k + 1) * 512 \
                    and len(b.prompt_ids) >= (k + 1) * 512:
                assert a.prompt_ids[k * 512:(k + 1) * 512] != b.prompt_ids[k * 512:(k + 1) * 512]
            pairs += n > 0
    assert pairs > 0  # the trace's first requests do share blocks
    text = tok.decode(list(reqs[0].prompt_ids[:300]))
    assert text.count(" ") > 40 and "\ufffd" not in text
