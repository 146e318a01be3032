"""A compile session given an incumbent: one that cannot be read is refused before anything is written.

A session timed against an incumbent, which the reference competes with and a planted candidate beats, is
`test_compile.py::test_the_whole_loop_on_a_tiny_preset`; the variant search doing so over a wall-clock budget is
`tests/slow/test_compile_slow.py::test_a_slow_incumbent_is_beaten_and_named`."""

from __future__ import annotations

from pathlib import Path

import pytest

from athanor.errors import ConfigError
from athanor.loop import CompileConfig, compile_session


def test_a_bad_incumbent_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    for directory in (tmp_path / "missing", tmp_path / "empty"):
        with pytest.raises(ConfigError, match="^--incumbent: "):
            compile_session(CompileConfig(model="tiny-dense", out_dir=tmp_path / "run", incumbent=directory))
    assert not (tmp_path / "run").exists()
