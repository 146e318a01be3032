"""Step scripts: long setup prefills split into steps of bounded size, with the same cache contents."""

from __future__ import annotations

from athanor.evaluate.scripts import prefill_steps


def test_prefill_steps_bound_each_step_and_keep_every_token_in_place():
    prompts = [list(range(100 * i, 100 * i + n)) for i, n in enumerate([5, 23, 9, 3])]
    steps = prefill_steps(prompts, [3, 0, 1, 2], [0, 0, 4, 0], [-1, -2, -3, -4], keep_logits=True, budget=10)
    assert all(s.tokens.numel() <= 10 and s.keep_logits for s in steps)
    placed = {}  # (slot, position) -> token, over every step
    last = {}  # slot -> (position of its last token in a step, that step's next token)
    for s in steps:
        cu = s.cu_seqlens.tolist()
        assert len(set(s.slots.tolist())) == len(s.slots)  # a slot appears once per step
        for b, slot in enumerate(s.slots.tolist()):
            toks, pos = s.tokens[cu[b]:cu[b + 1]].tolist(), s.positions[cu[b]:cu[b + 1]].tolist()
            assert pos[0] == s.seq_lens[b]  # the chunk continues where the slot's cache ends
            placed.update({(slot, p): t for p, t in zip(pos, toks, strict=True)})
            last[slot] = (pos[-1], int(s.next_tokens[b]))
    expected = {(slot, start + i): t for q, slot, start in zip(prompts, [3, 0, 1, 2], [0, 0, 4, 0], strict=True)
                for i, t in enumerate(q)}
    assert placed == expected
    assert last == {3: (4, -1), 0: (22, -2), 1: (12, -3), 2: (2, -4)}  # the prompt's own next token at its end


def test_prefill_steps_packs_prompts_that_fit_into_one_step():
    steps = prefill_steps([[1, 2], [3], [4, 5, 6]], [0, 1, 2], [0, 0, 0], [7, 8, 9])
    assert len(steps) == 1 and steps[0].tokens.tolist() == [1, 2, 3, 4, 5, 6]
