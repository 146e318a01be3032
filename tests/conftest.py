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
