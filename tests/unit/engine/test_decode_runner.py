"""`DecodeRunner` on the CPU (its eager path): greedy steps take a forward's own tokens where it makes them."""

from __future__ import annotations

import pytest
import torch

from athanor.engine.graphs import DecodeRunner, StepInputs
from athanor.errors import CandidateError
from athanor.model import BuildContext
from athanor.model.presets import get_preset
from athanor.model.random_init import random_model
from athanor.model.reference import build as reference_build


def test_greedy_steps_take_decode_greedy_and_check_what_it_returns() -> None:
    spec = get_preset("tiny-dense").with_layers(1)
    cpu = torch.device("cpu")
    forward = reference_build(random_model(spec, seed=0), BuildContext(cpu, torch.float32, 4, 64))
    runner = DecodeRunner(forward, 4, spec.vocab_size, cpu, (1, 2, 4))
    two = torch.tensor([0, 1])
    x = StepInputs(torch.tensor([5, 9]), two, two, two, torch.zeros(2), torch.ones(2), torch.zeros(2, dtype=torch.long))
    calls: list[int] = []

    def decode_greedy(batch):
        calls.append(1)
        logits = forward.decode(batch)
        return (logits.argmax(-1) + 1) % spec.vocab_size, logits  # tokens of its own making, whatever they are

    forward.decode_greedy = decode_greedy
    assert not runner.forward_tokens
    tokens, logits, used_graph = runner.step(x, greedy=True)
    assert calls == [1] and not used_graph and runner.forward_tokens
    assert torch.equal(tokens, (logits.argmax(-1) + 1) % spec.vocab_size)  # the runner passes them on (checking
    # them against the logits is the evaluator's: `trajectory.check_greedy_tokens`)
    runner.step(x)  # a sampled step: decode(), not decode_greedy()
    assert calls == [1]
    forward.decode_greedy = forward.decode
    with pytest.raises(CandidateError, match=r"decode_greedy\(\) returned Tensor, expected \(tokens"):
        runner.step(x, greedy=True)
    forward.decode_greedy = lambda batch: (forward.decode(batch).argmax(-1).int(), forward.decode(batch))
    with pytest.raises(CandidateError, match="torch.int32 tensor of shape .2. as its tokens, expected an int64"):
        runner.step(x, greedy=True)


def test_a_static_shape_forward_is_padded_to_its_bucket_and_warmed_at_every_one() -> None:
    """A forward compiled for fixed shapes (`static_shapes`) sees only the buckets' batch sizes, all of them at the
    warm-up, and its steps give the same rows as the unpadded reference's."""
    spec = get_preset("tiny-dense").with_layers(1)
    cpu = torch.device("cpu")
    model = random_model(spec, seed=0)
    forward = reference_build(model, BuildContext(cpu, torch.float32, 4, 64))
    seen: list[int] = []
    decode = forward.decode
    forward.decode = lambda batch: (seen.append(int(batch.tokens.shape[0])), decode(batch))[1]
    forward.static_shapes = True
    runner = DecodeRunner(forward, 4, spec.vocab_size, cpu, (1, 2, 4))
    runner.warm()
    assert seen == [1, 2, 4]
    seen.clear()
    three = torch.tensor([0, 1, 2])
    x = StepInputs(torch.tensor([5, 9, 3]), three, three, three, torch.zeros(3), torch.ones(3),
                   torch.zeros(3, dtype=torch.long))
    tokens, logits, used_graph = runner.step(x, greedy=True)
    assert seen == [4] and not used_graph and tokens.shape == (3,) and logits.shape == (3, spec.vocab_size)
    plain = reference_build(model, BuildContext(cpu, torch.float32, 4, 64))
    want = DecodeRunner(plain, 4, spec.vocab_size, cpu, (1, 2, 4)).step(x, greedy=True)[1]
    assert torch.allclose(logits, want, atol=1e-6)
