"""scripts/check_history.py: commit names and bench/results paths in src/ fail the lint, nothing else does."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "check_history.py"


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True).stdout.strip()


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git on PATH")
def test_commit_names_and_results_paths_in_src_are_reported(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    (repo / "src").mkdir(parents=True)
    _git(repo, "init", "-q")
    (repo / "src" / "a.py").write_text("X = 1\n")
    _git(repo, "add", ".")
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false", "commit", "-q", "-m", "first")
    head = _git(repo, "rev-parse", "HEAD")

    def check() -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, str(SCRIPT)], cwd=repo, capture_output=True, text=True)

    clean = (
        "# a hex word that names no commit: deadbeefcafe, and a digest sha256:" + "ab" * 32 + "\n"
        "X = 0x1234567\n"
    )
    (repo / "src" / "a.py").write_text(clean)
    assert check().returncode == 0

    (repo / "src" / "a.py").write_text(clean + f"# measured at {head[:7]}\n")
    (repo / "src" / "b.py").write_text("# see bench/results/x/\n")  # untracked files are checked too
    (repo / "notes.md").write_text(f"{head}\n")  # outside src/: not checked
    result = check()
    assert result.returncode == 1
    assert result.stdout.splitlines() == [f"src/a.py:3: {head[:7]}", "src/b.py:1: bench/results"]
