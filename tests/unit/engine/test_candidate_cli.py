"""From a hand-edited candidate file to a deployable directory: `athanor candidate new`, then `candidate pack`."""

from __future__ import annotations

from pathlib import Path

import pytest

from athanor.cli import main
from athanor.engine.candidate import Candidate
from athanor.engine.candidate_dir import load_candidate_dir


def test_new_then_pack_gives_the_directory_serve_loads(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    file, out = tmp_path / "mine.py", tmp_path / "mine"
    assert main(["candidate", "new", "--model", "tiny-dense", "-o", str(file)]) == 0
    header = file.read_text().split("\n\n")[0]
    assert f"athanor candidate pack {file.name} -o DIR" in header and "athanor evaluate" in header
    file.write_text(file.read_text() + "\n# an edit\n")
    assert main(["candidate", "pack", str(file), "-o", str(out), "--description", "my edit"]) == 0
    loaded = load_candidate_dir(out)
    assert loaded.source == file.read_text() and loaded.id == Candidate.from_source(file.read_text()).id
    assert loaded.manifest.description == "my edit" and loaded.manifest.author == "user"
    assert f"--candidate {out}" in capsys.readouterr().out


@pytest.mark.parametrize(("content", "said"), [
    ("def build(model, ctx):\n    return (\n", "fix the candidate before packing it"),
    ("x = 1\n", "defines no build(model, ctx)"),
])
def test_pack_refuses_what_cannot_be_a_candidate(tmp_path: Path, capsys: pytest.CaptureFixture[str], content: str,
                                                 said: str) -> None:
    file = tmp_path / "bad.py"
    file.write_text(content)
    assert main(["candidate", "pack", str(file), "-o", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and said in err[0] and not (tmp_path / "out").exists()


def test_pack_keeps_a_candidate_already_there_unless_forced(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    file, out = tmp_path / "c.py", tmp_path / "c"
    assert main(["candidate", "new", "-o", str(file)]) == 0
    assert main(["candidate", "pack", str(file), "-o", str(out)]) == 0
    assert main(["candidate", "pack", str(file), "-o", str(out)]) == 2
    assert "pass --force" in capsys.readouterr().err
    assert main(["candidate", "pack", str(file), "-o", str(out), "--force"]) == 0
