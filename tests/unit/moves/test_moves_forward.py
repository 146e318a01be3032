"""Every move and the best-known candidates against the reference forward, on CPU.

Each rendered candidate prefills a batch of prompts of different lengths (one continuing a
cached prefix) and decodes two steps; its logits must match the reference's in fp32. Triton
options run their kernels in the interpreter (conftest sets TRITON_INTERPRET=1).
"""

from __future__ import annotations

import importlib.util
import itertools
import sys
from pathlib import Path

import pytest
import torch

from athanor.model import BuildContext, DecodeBatch, make_prefill_batch
from athanor.model.presets import PRESETS
from athanor.model.random_init import random_model
from athanor.model.reference import build as build_reference
from athanor.moves import MOVES, best_options, render

_serial = itertools.count()


def load_candidate(source: str, tmp_path: Path):
    """Import a candidate source from a file (as the engine does, so @triton.jit can read it)."""
    path = tmp_path / f"candidate_{next(_serial)}.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[path.stem] = module
    spec.loader.exec_module(module)
    return module


def run(build, model, gen):
    """Logits of prefill (3 prompts, one continued) and two decode steps."""
    ctx = BuildContext(torch.device("cpu"), torch.float32, max_seqs=4, max_seq_len=64)
    fwd = build(model, ctx)
    lens = [5, 11, 2]
    prompts = [torch.randint(0, model.spec.vocab_size, (n,), generator=gen).tolist() for n in lens]
    outs = [fwd.prefill(make_prefill_batch(prompts, [0, 2, 3]))]
    # continue slot 2 by 4 more tokens (a chunked prefill)
    more = torch.randint(0, model.spec.vocab_size, (4,), generator=gen).tolist()
    outs.append(fwd.prefill(make_prefill_batch([more], [2], seq_lens=[11])))
    positions = torch.tensor([5, 15, 2])
    for _ in range(2):
        tokens = torch.randint(0, model.spec.vocab_size, (3,), generator=gen)
        batch = DecodeBatch(tokens, positions.clone(), torch.tensor([0, 2, 3]), positions.clone())
        outs.append(fwd.decode(batch))
        positions += 1
    return outs


def check(source: str, preset: str, tmp_path: Path, gen: torch.Generator) -> None:
    model = random_model(PRESETS[preset], seed=int(torch.randint(0, 1000, (1,), generator=gen)))
    seed = int(torch.randint(0, 2**31, (1,), generator=gen))
    candidate = load_candidate(source, tmp_path)
    with torch.no_grad():
        got = run(candidate.build, model, torch.Generator().manual_seed(seed))
        expected = run(build_reference, model, torch.Generator().manual_seed(seed))
    for step, (a, b) in enumerate(zip(got, expected)):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4, msg=lambda m, s=step: f"step {s}: {m}")


SINGLE_MOVES = [(m.name, v) for m in MOVES for v in m.values if v != m.baseline and m.name != "compile"]


@pytest.mark.parametrize(("name", "value"), SINGLE_MOVES, ids=[f"{n}={v}" for n, v in SINGLE_MOVES])
def test_one_move_matches_reference(name, value, tmp_path, gen):
    preset = "tiny-moe" if name in ("moe", "routing", "fused_gate_up") else "tiny-qwen"
    check(render("fast", {name: value}), preset, tmp_path, gen)


@pytest.mark.parametrize("preset", ["tiny-dense", "tiny-qwen", "tiny-moe"])
@pytest.mark.parametrize("device", ["cuda", "cpu"])
def test_best_known_matches_reference(preset, device, tmp_path, gen):
    check(render("fast", best_options(PRESETS[preset], device)), preset, tmp_path, gen)


def test_everything_triton_with_token_major_kv_and_split_k(tmp_path, gen):
    options = {**best_options(PRESETS["tiny-moe"]), "kv_layout": "token_major", "gemv": "triton_splitk",
               "fused_gate_up": True}
    check(render("fast", options), "tiny-moe", tmp_path, gen)


def test_compiled_baseline_matches_reference(tmp_path, gen):
    pytest.importorskip("torch._inductor")
    check(render("fast", {"compile": "default", "fused_qkv": True}), "tiny-dense", tmp_path, gen)
