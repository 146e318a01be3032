"""One real `athanor serve` (smollm2-135m, CPU, 127.0.0.1, a free port) shared by the tests of this folder."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from athanor.engine.candidate import Candidate, reference_source
from athanor.engine.candidate_dir import write_candidate_dir
from athanor.serve.launch import ServerProcess

MODEL = "smollm2-135m"
TOKEN = "test-admin-token-3f9a"

WRONG_LOGITS = '''

# Planted fault for the canary test: the forward is correct code, but its logits are scrambled.
_reference_build = build


class _WrongLogits:
    def __init__(self, inner):
        self.inner = inner
        self.graph_safe = inner.graph_safe

    def prefill(self, batch):
        return self.inner.prefill(batch).flip(-1)

    def decode(self, batch):
        return self.inner.decode(batch).flip(-1)


def build(model, ctx):  # noqa: F811
    return _WrongLogits(_reference_build(model, ctx))
'''


BROKEN_BUILD = '''

# Planted fault: the candidate imports, but its build fails.
def build(model, ctx):  # noqa: F811
    raise RuntimeError("planted: this candidate cannot build")
'''


@dataclass(frozen=True)
class Server:
    url: str
    log_path: Path
    store_path: Path
    work: Path

    @property
    def admin(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture(scope="session")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    work = tmp_path_factory.mktemp("serve")
    (work / "token").write_text(TOKEN + "\n")
    log_path, store_path = work / "requests.jsonl", work / "store.sqlite"
    proc = ServerProcess(["--model", MODEL, "--max-seqs", "8", "--max-seq-len", "512", "--admin-token-file",
                          str(work / "token"), "--log", str(log_path), "--store", str(store_path)],
                         work / "server.log")
    proc.start()
    try:
        yield Server(proc.url, log_path, store_path, work)
    finally:
        proc.stop()


def candidate_dir(root: Path, name: str, extra: str) -> Path:
    source = reference_source() + extra
    return write_candidate_dir(Candidate.from_source(source, author="test", description=name), root / name)


@pytest.fixture
def good_candidate(server: Server) -> Path:
    """The reference forward under another content hash (same logits)."""
    return candidate_dir(server.work, "good", "\n# a copy of the reference, deployed through the canary\n")


@pytest.fixture
def bad_candidate(server: Server) -> Path:
    return candidate_dir(server.work, "bad", WRONG_LOGITS)


@pytest.fixture
def broken_candidate(server: Server) -> Path:
    return candidate_dir(server.work, "broken", BROKEN_BUILD)
