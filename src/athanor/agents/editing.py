"""Reading a coding model's reply: SEARCH/REPLACE blocks or a whole file, applied to a candidate.

A reply may hold SEARCH/REPLACE blocks

    <<<<<<< SEARCH
    lines quoted from the source
    =======
    their replacement
    >>>>>>> REPLACE

(fenced or not, several in a row) or one fenced code block holding the whole new file (it must
define `build`). Blocks win when both appear. A SEARCH that matches nowhere, or in several places,
is an `EditError` whose message goes back to the model in the next prompt, so it can quote again.
Matching is exact first, then tolerant of trailing whitespace, then of a uniform indentation shift
(models often drop a method's indentation), always requiring a unique match.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable
from dataclasses import dataclass

from athanor.agents.base import AgentError

_START = re.compile(r"^\s*<{5,}\s*SEARCH\s*$")
_DIVIDER = re.compile(r"^\s*={5,}\s*$")
_END = re.compile(r"^\s*>{5,}\s*REPLACE\s*$")
_FENCE = re.compile(r"^```[\w+-]*[ \t]*\n(.*?)^```[ \t]*$", re.DOTALL | re.MULTILINE)
_DESCRIPTION = re.compile(r"^\s*(?:\*\*)?description(?:\*\*)?\s*:\s*(?:\*\*)?\s*(.+)$", re.IGNORECASE | re.MULTILINE)


class EditError(AgentError):
    """A reply could not be turned into a new candidate; the message is fed back to the model."""


@dataclass(frozen=True)
class SearchReplace:
    search: str
    replace: str


@dataclass(frozen=True)
class Edit:
    """A parsed reply: either `blocks` or `full_source` is set."""

    blocks: tuple[SearchReplace, ...] = ()
    full_source: str | None = None
    description: str = ""


def parse_reply(text: str) -> Edit:
    """The edit a reply asks for; EditError when it holds neither blocks nor a whole file."""
    text = text.replace("\r\n", "\n")
    description = _description(text)
    blocks = _search_replace_blocks(text)
    if blocks:
        return Edit(blocks=blocks, description=description)
    files = [m.group(1) for m in _FENCE.finditer(text) if re.search(r"^def build\(", m.group(1), re.MULTILINE)]
    if files:
        return Edit(full_source=files[-1], description=description)
    raise EditError("the reply has neither SEARCH/REPLACE blocks nor a fenced code block with the whole file "
                    "(defining build); answer in one of those two formats")


def apply_edit(source: str, edit: Edit) -> str:
    """The new source; EditError when a block does not apply or the result does not parse."""
    if edit.full_source is not None:
        new = edit.full_source
    else:
        new = source
        for number, block in enumerate(edit.blocks, start=1):
            new = _apply_block(new, block, number)
    if new.strip() == source.strip():
        raise EditError("the edit leaves the candidate unchanged; change something")
    try:
        compile(new, "candidate.py", "exec")
    except SyntaxError as e:
        raise EditError(f"the edited candidate does not parse: line {e.lineno}: {e.msg}") from None
    return new if new.endswith("\n") else new + "\n"


def _description(text: str) -> str:
    match = _DESCRIPTION.search(text)
    if match:
        return match.group(1).strip()[:200]
    for line in text.splitlines():
        line = line.strip().lstrip("#").strip()
        if line and not line.startswith(("```", "<<<<<<<")):
            return line[:200]
    return ""


def _search_replace_blocks(text: str) -> tuple[SearchReplace, ...]:
    blocks: list[SearchReplace] = []
    lines = text.split("\n")
    i = 0
    while i < len(lines):
        if not _START.match(lines[i]):
            i += 1
            continue
        search: list[str] = []
        replace: list[str] = []
        part = search
        j = i + 1
        while j < len(lines) and not _END.match(lines[j]):
            if part is search and _DIVIDER.match(lines[j]):
                part = replace
            else:
                part.append(lines[j])
            j += 1
        number = len(blocks) + 1
        if j == len(lines):
            raise EditError(f"SEARCH/REPLACE block {number} is not closed by a '>>>>>>> REPLACE' line")
        if part is search:
            raise EditError(f"SEARCH/REPLACE block {number} has no '=======' line between SEARCH and REPLACE")
        blocks.append(SearchReplace("\n".join(search), "\n".join(replace)))
        i = j + 1
    return tuple(blocks)


def _apply_block(source: str, block: SearchReplace, number: int) -> str:
    if not block.search.strip():
        raise EditError(f"SEARCH block {number} is empty; quote the lines to replace")
    count = source.count(block.search)
    if count == 1:
        return source.replace(block.search, block.replace, 1)
    if count > 1:
        raise EditError(f"SEARCH block {number} matches {count} places; quote more surrounding lines so it is unique")
    src_lines = source.split("\n")
    search_lines = block.search.split("\n")
    replace_lines = block.replace.split("\n")
    for normalise in (str.rstrip, str.strip):
        starts = _line_matches(src_lines, search_lines, normalise)
        if len(starts) > 1:
            raise EditError(f"SEARCH block {number} matches {len(starts)} places (ignoring whitespace); "
                            "quote more surrounding lines so it is unique")
        if len(starts) == 1:
            start = starts[0]
            if normalise is str.strip:
                replace_lines = _reindent(replace_lines, search_lines, src_lines[start:start + len(search_lines)])
            return "\n".join(src_lines[:start] + replace_lines + src_lines[start + len(search_lines):])
    raise EditError(f"SEARCH block {number} does not match the source{_closest(src_lines, search_lines)}; "
                    "quote the current source exactly")


def _line_matches(src: list[str], search: list[str], normalise: Callable[[str], str]) -> list[int]:
    wanted = [normalise(s) for s in search]
    have = [normalise(s) for s in src]
    n = len(wanted)
    return [i for i in range(len(have) - n + 1) if have[i:i + n] == wanted]


def _indent(line: str) -> str:
    return line[:len(line) - len(line.lstrip())]


def _reindent(replace: list[str], search: list[str], found: list[str]) -> list[str]:
    """Shift the replacement by the indentation the SEARCH lost (or gained) against the source."""
    first = next((k for k, s in enumerate(search) if s.strip()), 0)
    have, said = _indent(found[first]), _indent(search[first])
    if len(have) >= len(said):
        extra = have[len(said):]
        return [extra + line if line.strip() else line for line in replace]
    cut = len(said) - len(have)
    return [line[cut:] if line[:cut].strip() == "" else line.lstrip() for line in replace]


def _closest(src: list[str], search: list[str]) -> str:
    first = next((s.strip() for s in search if s.strip()), "")
    close = difflib.get_close_matches(first, [s.strip() for s in src], n=1, cutoff=0.6)
    if not close:
        return f" (no line resembles {first[:80]!r})"
    line_no = [s.strip() for s in src].index(close[0]) + 1
    return f" (its first line {first[:80]!r} resembles line {line_no}: {close[0][:80]!r})"
