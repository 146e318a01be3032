"""The interleaved trajectory (`evaluate/interleave.py`): the same outputs as one worker's whole-script run, and a
worker's CPU time held to the turns it was given."""

from __future__ import annotations

import eval_candidates as c
import pytest
import torch
from eval_config import CONFIG

from athanor.engine import protocol as p
from athanor.evaluate import Evaluator, scripts
from athanor.evaluate.engines import twin_of

SPINNER = c.patched(
    "import threading\n"
    "_reference_build = build\n"
    "def build(model, ctx):\n"
    "    a = torch.randn(256, 256)\n"
    "    def spin():\n"
    "        while True:\n"
    "            a @ a  # a torch op: the GIL is released, so it takes a core of its own\n"
    "    threading.Thread(target=spin, daemon=True).start()\n"
    "    return _reference_build(model, ctx)\n",
    "the reference, with a thread that burns a core from build() on",
)


def test_stepwise_fingerprints_are_the_whole_script_runs_bit_for_bit(runtime_evaluator: Evaluator) -> None:
    """Next tokens scored a request later, inputs sent a step at a time: the fingerprints (log p(next) included),
    argmax and kept logits are exactly those of the reference worker running the whole script in one request."""
    engines = runtime_evaluator.engines("fast")
    engines.prepare(c.BASE, 60)
    text = scripts.TextSource(runtime_evaluator.spec.vocab_size, 7)
    script = scripts.check_script(text, CONFIG.max_seqs, CONFIG.max_seq_len, max_tokens=24)
    ids = (c.BASE.id, twin_of(c.BASE).id)
    mine = engines.run(ids, script, 11, 60, logits_of=ids[:1])
    ref = engines.run_reference(script, 11, 60)
    assert mine.status == "ok", mine.error
    assert mine.fingerprints is not None and ref.fingerprints is not None and mine.logits is not None
    assert torch.isfinite(mine.fingerprints[:, :, -2]).any()  # the delayed scores arrived
    for side in range(2):
        assert torch.equal(mine.fingerprints[side].nan_to_num(), ref.fingerprints[0].nan_to_num())
        assert torch.equal(mine.tokens[side], ref.tokens[0])  # type: ignore[index]
    assert ref.logits is not None and torch.equal(mine.logits[0], ref.logits[0])


def test_a_step_sent_without_a_resident_step_to_score_is_invalid(runtime_evaluator: Evaluator) -> None:
    engines = runtime_evaluator.engines("fast")
    engines.prepare(c.BASE, 60)
    reply = engines.incumbent.call(p.StepRequest(c.BASE.id, None, score_next=torch.zeros(1, dtype=torch.long)))
    assert reply.status == "invalid" and "nothing to score" in reply.error


@pytest.mark.timing  # needs the second core free for the thread to take it: run alone (Makefile `test`)
def test_a_thread_that_burns_a_core_beside_its_steps_is_refused(runtime_evaluator: Evaluator) -> None:
    """Stopped between its turns, the thread can only run during them, on a core the worker was not given: its
    CPU time exceeds the turns' wall time at the worker's threads."""
    v = runtime_evaluator.evaluate(SPINNER, incumbent=c.BASE)
    assert not v.accepted and v.status == "rejected", v.reason
    assert v.reason.startswith("violation: ") and "CPU seconds" in v.reason and "not given" in v.reason
