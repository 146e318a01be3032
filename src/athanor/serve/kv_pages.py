"""The KV memory one resident candidate's sequences hold in the server: the rows of its block table (`SlotPool`)
and the pages of its pool (`PagePool`), with the prefix cache over full pages.

Pure Python (no torch): the scheduler (`athanor.serve.scheduler`) decides every block-table entry here and the
executor copies the writes to the device (`PagePool.take_updates`, `athanor.engine.pages.write_pages`).
"""

from __future__ import annotations

import hashlib
from array import array
from collections import deque
from collections.abc import Iterable


class SlotPool:
    """Free rows of one resident candidate's block table (row `max_seqs` is the engine's padding slot: never
    handed out). A slot carries nothing between sequences: reuse lives in the pages."""

    def __init__(self, max_seqs: int) -> None:
        self._free: deque[int] = deque(range(max_seqs))

    def take(self) -> int:
        return self._free.popleft()

    def give(self, slot: int) -> None:
        self._free.append(slot)

    @property
    def num_free(self) -> int:
        return len(self._free)


def page_key(prev: bytes, tokens: list[int]) -> bytes:
    """Prefix-cache key of a full page: a hash of the previous page's key and this page's tokens, so equal keys
    mean equal tokens from position 0 to the page's end (hashlib: stable across processes, no collisions to fear)."""
    return hashlib.blake2b(prev + array("q", tokens).tobytes(), digest_size=16).digest()


class PagePool:
    """The KV pages of one resident candidate: who holds them, which full pages are cached under a prefix key,
    and the block-table writes the executor has yet to copy to the device.

    A page is in one of three states: *held* (refcount >= 1: by sequences, as an entry of their slot's row),
    *evictable* (refcount 0, still cached: a later sequence with the same prefix can take it back), or *free*.
    Taking a page uses a free one first, else evicts the least recently released evictable one.
    """

    def __init__(self, num_pages: int, page_size: int) -> None:
        self.num_pages = num_pages
        self.page_size = page_size
        self._refs = [0] * num_pages
        self._free: deque[int] = deque(range(num_pages))
        self._cached: dict[bytes, int] = {}
        """Prefix key -> the page holding exactly that prefix's last page."""
        self._key_of: dict[int, bytes] = {}
        self._evictable: dict[int, None] = {}
        """Cached pages nobody holds, least recently released first (dicts keep insertion order)."""
        self._updates: dict[tuple[int, int], int] = {}
        """(slot, index in its row) -> page, written since the last `take_updates` (the last write wins)."""

    # -- reading --------------------------------------------------------------------------------------
    @property
    def num_available(self) -> int:
        """Pages a sequence could take now: free ones and evictable cached ones."""
        return len(self._free) + len(self._evictable)

    def refcount(self, page: int) -> int:
        return self._refs[page]

    def is_cached(self, page: int) -> bool:
        return page in self._key_of

    def lookup(self, key: bytes) -> int | None:
        """The cached page under `key`, or None."""
        return self._cached.get(key)

    def available_besides(self, pages: list[int]) -> int:
        """`num_available` once `pages` (cached ones about to be acquired) are held."""
        return self.num_available - sum(1 for p in pages if p in self._evictable)

    # -- holding ---------------------------------------------------------------------------------------
    def acquire(self, pages: list[int]) -> None:
        """Hold cached pages (a prefix hit): they leave the evictable list while anyone holds them."""
        for page in pages:
            self._refs[page] += 1
            self._evictable.pop(page, None)

    def allocate(self, n: int) -> list[int]:
        """`n` fresh pages held once, for the caller to write; the caller checked `num_available`."""
        assert n <= self.num_available, f"{n} pages wanted, {self.num_available} available"
        out = []
        for _ in range(n):
            if self._free:
                page = self._free.popleft()
            else:
                page = next(iter(self._evictable))
                del self._evictable[page]
                del self._cached[self._key_of.pop(page)]
            self._refs[page] = 1
            out.append(page)
        return out

    def release(self, pages: list[int]) -> None:
        """Drop one hold on each page. In reverse, so that a sequence's later pages are evicted before its earlier
        ones: a prefix is found page by page from the first, so a lost first page would orphan the rest."""
        for page in reversed(pages):
            self._refs[page] -= 1
            assert self._refs[page] >= 0, f"page {page} released more often than held"
            if self._refs[page] == 0:
                if page in self._key_of:
                    self._evictable[page] = None
                else:
                    self._free.append(page)

    def cache(self, page: int, key: bytes) -> None:
        """Register a held page whose tokens are all computed under its prefix key. When another page already
        holds that prefix (two sequences computed it side by side), this one stays private and is freed later."""
        if key not in self._cached and page not in self._key_of:
            self._cached[key] = page
            self._key_of[page] = key

    def forget(self, pages: Iterable[int]) -> None:
        """Uncache held pages whose content is in doubt (a failed candidate): no later sequence will hit them."""
        for page in pages:
            key = self._key_of.pop(page, None)
            if key is not None:
                del self._cached[key]

    # -- the block table -------------------------------------------------------------------------------
    def map(self, slot: int, first: int, pages: list[int]) -> None:
        """Record that entries `first`, `first + 1`, ... of `slot`'s row now name `pages`."""
        for i, page in enumerate(pages, first):
            self._updates[slot, i] = page

    def take_updates(self) -> list[tuple[int, int, int]]:
        """The (slot, index in its row, page) writes since the last call, each entry once (its last value).
        Entries past a sequence's length are never read, so freed rows are not cleared."""
        out = [(slot, i, page) for (slot, i), page in self._updates.items()]
        self._updates.clear()
        return out
