"""The static stage: the reference passes; every forbidden construct is named with its line."""

from __future__ import annotations

import pytest
from eval_candidates import BASE, STATIC_CHEATS

from athanor.evaluate.static_checks import check_source


def test_reference_passes() -> None:
    assert check_source(BASE.source) == []


@pytest.mark.parametrize("what", sorted(STATIC_CHEATS))
def test_cheat_is_refused(what: str) -> None:
    findings = check_source(BASE.source + "\n" + STATIC_CHEATS[what])
    assert findings, what
    assert all(f.line > BASE.source.count("\n") for f in findings)


def test_stream_with_sync_is_allowed() -> None:
    src = ("def side(x):\n    s = torch.cuda.Stream()\n    s.wait_stream(torch.cuda.current_stream())\n"
           "    with torch.cuda.stream(s):\n        y = x * 2\n    torch.cuda.current_stream().wait_stream(s)\n"
           "    return y\n")
    assert check_source(BASE.source + "\n" + src) == []


def test_syntax_error_is_one_finding() -> None:
    [finding] = check_source("def build(:\n")
    assert "does not parse" in finding.message
