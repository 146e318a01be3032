"""Fail when src/ carries history: a token naming a commit of this repository, or a bench/results path.

A comment or docstring states the rule and its reason; which commit, which A/B and which figures chose it
belong in the commit body and the benchmark record. Prints one `file:line: token` per hit and exits 1 if any.

    python scripts/check_history.py [ROOT ...]   # default: src
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

# A run of 7-40 hex digits standing alone: the lengths `git` prints and accepts as a commit name.
HEX_TOKEN = re.compile(r"(?<![0-9A-Za-z_])[0-9a-fA-F]{7,40}(?![0-9A-Za-z_])")
RESULTS_PATH = re.compile(r"bench/results")


def tracked_files(roots: list[str]) -> list[Path]:
    """Files under `roots` that git tracks or would track (untracked, not ignored)."""
    out = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z", "--", *roots],
        check=True,
        capture_output=True,
    ).stdout
    return sorted({Path(name) for name in out.decode().split("\0") if name and Path(name).is_file()})


def commit_tokens(tokens: set[str]) -> set[str]:
    """The tokens that name a commit, asked of git in one batch."""
    if not tokens:
        return set()
    ordered = sorted(tokens)
    query = "".join(f"{token}^{{commit}}\n" for token in ordered)
    out = subprocess.run(
        ["git", "cat-file", "--batch-check=%(objecttype)"],
        input=query,
        check=True,
        capture_output=True,
        text=True,
    ).stdout.splitlines()
    # One answer line per query line: the object type when it resolves, "<query> missing" or
    # "<query> ambiguous" when it does not.
    return {token for token, answer in zip(ordered, out, strict=True) if answer == "commit"}


def find_hits(roots: list[str]) -> list[tuple[Path, int, str]]:
    """(file, line number, token) for every commit name and bench/results path under `roots`."""
    candidates: list[tuple[Path, int, str]] = []
    for path in tracked_files(roots):
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        for number, line in enumerate(text.splitlines(), start=1):
            candidates.extend((path, number, m.group()) for m in HEX_TOKEN.finditer(line))
            candidates.extend((path, number, m.group()) for m in RESULTS_PATH.finditer(line))
    commits = commit_tokens({token.lower() for _, _, token in candidates if HEX_TOKEN.fullmatch(token)})
    return [hit for hit in candidates if hit[2] == "bench/results" or hit[2].lower() in commits]


def main(argv: list[str]) -> int:
    hits = find_hits(argv or ["src"])
    for path, number, token in hits:
        print(f"{path}:{number}: {token}")
    if hits:
        print(
            f"check_history: {len(hits)} hit(s); state the rule and its reason instead, and put the "
            "history in the commit body or the benchmark record",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
