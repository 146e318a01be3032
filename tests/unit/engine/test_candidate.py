"""Candidates: content hash, unique module names, getsource, clear import errors, namespace restore."""

from __future__ import annotations

import inspect
import sys
from pathlib import Path

import pytest

import athanor.model.reference as reference
from athanor.engine.candidate import Candidate, baseline_candidate, import_candidate, unload_module
from athanor.engine.isolation import ModuleGuard
from athanor.errors import CandidateError


def test_manifest_hash_identifies_the_source() -> None:
    a = Candidate.from_source("x = 1\n", parent="p", author="agent-1")
    assert a.id == Candidate.from_source("x = 1\n").id != Candidate.from_source("x = 2\n").id
    a.check_hash()
    forged = Candidate("x = 3\n", a.manifest)
    with pytest.raises(CandidateError, match="content hash"):
        forged.check_hash()


def test_import_under_unique_name_with_source_on_disk(tmp_path: Path) -> None:
    cand = Candidate.from_source("SEAM_VERSION = 2\ndef f():\n    return 42\n")
    one = import_candidate(cand, tmp_path / "a", 1)
    two = import_candidate(cand, tmp_path / "b", 2)
    assert one.__name__ != two.__name__ and one.f is not two.f
    assert "return 42" in inspect.getsource(one.f)  # what @triton.jit needs
    unload_module(one.__name__)
    unload_module(two.__name__)
    assert one.__name__ not in sys.modules


def test_bad_sources_give_clear_errors(tmp_path: Path) -> None:
    with pytest.raises(CandidateError, match=r"line 1.*does not parse"):
        import_candidate(Candidate.from_source("def build(:\n"), tmp_path, 1)
    with pytest.raises(CandidateError, match="ZeroDivisionError"):
        import_candidate(Candidate.from_source("SEAM_VERSION = 2\nx = 1 / 0\n"), tmp_path, 2)


def test_baseline_is_the_reference_source() -> None:
    assert baseline_candidate().source == Path(reference.__file__).read_text()


def test_guard_undoes_edits_to_athanor_modules() -> None:
    guard = ModuleGuard()
    original = reference.rms_norm
    reference.rms_norm = None  # type: ignore[assignment]
    reference.injected = 1  # type: ignore[attr-defined]
    changed = guard.restore()
    assert reference.rms_norm is original and not hasattr(reference, "injected")
    assert "athanor.model.reference" in changed


def test_a_candidate_that_imports_dynamo_changes_nothing_in_torchs_namespace():
    """The worker does to torch.manual_seed before its snapshot what Dynamo's import would (a candidate that
    compiles imports Dynamo): afterwards that import rebinds nothing, and manual_seed still seeds."""
    import subprocess

    code = ("import torch\n"
            "from athanor.engine.worker import _rebind_like_dynamo\n"
            "_rebind_like_dynamo(torch)\n"
            "snapshot = dict(vars(torch))\n"
            "import torch._dynamo\n"
            "changed = [k for k, v in snapshot.items() if vars(torch).get(k) is not v]\n"
            "assert not changed, changed\n"
            "torch.manual_seed(3); a = torch.rand(2); torch.manual_seed(3)\n"
            "assert torch.equal(a, torch.rand(2))\n")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_a_file_of_the_old_seam_is_refused_in_one_line(tmp_path: Path) -> None:
    old = baseline_candidate().source.replace("SEAM_VERSION = 2", "SEAM_VERSION_WAS = 2")
    with pytest.raises(CandidateError, match=r"follows candidate seam 1; this athanor builds seam 2") as e:
        import_candidate(Candidate.from_source(old), tmp_path, 1)
    assert "\n" not in str(e.value)


def test_a_winner_directory_of_the_old_seam_is_refused(tmp_path: Path) -> None:
    from athanor.engine.candidate_dir import load_candidate_dir, write_candidate_dir
    from athanor.errors import ConfigError

    old = Candidate.from_source(baseline_candidate().source.replace("SEAM_VERSION = 2\n", ""))
    d = write_candidate_dir(old, tmp_path / "winner")
    with pytest.raises(ConfigError, match=r"candidate.py follows candidate seam 1"):
        load_candidate_dir(d)
