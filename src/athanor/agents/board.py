"""The message board: agents post ideas, results and warnings that every agent then sees.

The board is a view of the store's `posts` table scoped to one run, so posts survive the run and
agents in other processes (or a resumed run) see the same board. Posting is cheap and never
blocks evaluation; agents read the newest posts in their `AgentContext`.
"""

from __future__ import annotations

import logging

from athanor.store import Post, Store

log = logging.getLogger(__name__)

MAX_POST_CHARS = 2000
"""Posts go into every agent's prompt; a long one is cut here rather than crowding out the source."""


class Board:
    """One run's board in `store`."""

    def __init__(self, store: Store, run_id: str) -> None:
        self.store = store
        self.run_id = run_id

    def post(self, agent: str, kind: str, text: str, *, candidate_id: str | None = None) -> Post:
        """Post an `idea`, `result` or `warning`, optionally about a candidate."""
        text = text.strip()
        if len(text) > MAX_POST_CHARS:
            text = text[:MAX_POST_CHARS] + " ...(cut)"
        posted = self.store.post(self.run_id, agent, kind, text, candidate_id=candidate_id)
        log.info("board: [%s] %s: %s", kind, agent, text.splitlines()[0] if text else "")
        return posted

    def idea(self, agent: str, text: str, *, candidate_id: str | None = None) -> Post:
        return self.post(agent, "idea", text, candidate_id=candidate_id)

    def result(self, agent: str, text: str, *, candidate_id: str | None = None) -> Post:
        return self.post(agent, "result", text, candidate_id=candidate_id)

    def warning(self, agent: str, text: str, *, candidate_id: str | None = None) -> Post:
        return self.post(agent, "warning", text, candidate_id=candidate_id)

    def recent(self, limit: int = 20, *, since: int = 0) -> tuple[Post, ...]:
        """The newest `limit` posts after post id `since`, oldest first (as `AgentContext.posts`)."""
        return tuple(self.store.posts(self.run_id, since=since, limit=limit))
