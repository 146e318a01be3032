"""The violation witness: what counts as leaving the scratch directory."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from athanor.engine.violations import ViolationWatch


def test_removing_a_tree_inside_the_scratch_dir_is_allowed(tmp_path: Path) -> None:
    # shutil.rmtree removes names relative to a directory fd (as Triton's and Inductor's temp dirs do):
    # they must be resolved against that directory, not the working directory.
    scratch = tmp_path / "scratch"
    (scratch / "tmp" / "build").mkdir(parents=True)
    (scratch / "tmp" / "build" / "cuda_utils.c").write_text("x")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep").write_text("x")
    watch = ViolationWatch([str(scratch)])
    cwd = os.getcwd()
    os.chdir(outside)  # a relative name must not be resolved here
    try:
        with watch.armed():
            shutil.rmtree(scratch / "tmp" / "build")
        assert watch.take() == []
        with watch.armed():
            shutil.rmtree(outside)
        events = watch.take()
    finally:
        os.chdir(cwd)
    assert any("os.remove outside the scratch directory: keep" in e for e in events)


def test_mkdir_of_an_existing_directory_creates_nothing(tmp_path: Path) -> None:
    # Inductor's C++ builder calls Path(".").mkdir(exist_ok=True) from the worker's working directory.
    scratch, outside = tmp_path / "scratch", tmp_path / "outside"
    scratch.mkdir()
    outside.mkdir()
    watch = ViolationWatch([str(scratch)])
    with watch.armed():
        outside.mkdir(exist_ok=True)
        assert watch.take() == []
        (outside / "new").mkdir()
    assert watch.take() == [f"os.mkdir outside the scratch directory: {outside / 'new'}"]
