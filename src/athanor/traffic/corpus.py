"""Real English text for replay requests, so token statistics are those of language, not noise.

`corpus.txt` holds public-domain works, transcribed: Lincoln's Gettysburg Address (1863) and
Second Inaugural Address (1865); the opening of the US Declaration of Independence (1776); the
Preamble of the US Constitution and the Bill of Rights (1789-1791); Shakespeare's Sonnets 18
and 116 and Hamlet's "To be, or not to be" (c. 1600); the opening lines of Dickens' *A Tale of Two
Cities* (1859), Austen's *Pride and Prejudice* (1813) and Melville's *Moby-Dick* (1851).
All are in the public domain.
"""

from __future__ import annotations

import re
from functools import cache
from importlib import resources
from typing import Protocol


class Tokenizer(Protocol):
    """What replay needs of a tokenizer (athanor.model.tokenizer's objects satisfy it)."""

    def encode(self, text: str) -> list[int]: ...


@cache
def sentences() -> tuple[str, ...]:
    """The corpus split into sentences (ending in . ? ! : or ;)."""
    text = resources.files("athanor.traffic").joinpath("corpus.txt").read_text(encoding="utf-8")
    parts = re.split(r"(?<=[.?!:;])\s+", " ".join(text.split()))
    return tuple(p for p in parts if p)


def encoded_sentences(tokenizer: Tokenizer) -> list[list[int]]:
    """Each sentence, with a leading space, through `tokenizer` (as it would appear mid-text)."""
    out = [tokenizer.encode(" " + s) for s in sentences()]
    return [ids for ids in out if ids]
