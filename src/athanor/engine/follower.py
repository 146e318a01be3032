"""A layout group's rank other than 0: `python -m athanor.engine.follower CONFIG.json RANK`.

Started by rank 0 inside its sandbox (`athanor.engine.group.spawn_followers`); joins the group, loads its shard
and makes every call rank 0 publishes (`athanor.engine.group.follow`) until told to stop or orphaned.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2 or not args[1].isdigit():
        sys.stderr.write("usage: python -m athanor.engine.follower CONFIG.json RANK\n")
        return 2
    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s rank {args[1]} %(levelname)s %(name)s: %(message)s")
    from athanor.engine.config import EngineConfig
    from athanor.engine.group import follow
    from athanor.engine.worker import boot_follower, exit_with_parent

    exit_with_parent()
    engine, group = boot_follower(EngineConfig.from_json(Path(args[0]).read_text()), int(args[1]))
    follow(engine, group)
    return 0


if __name__ == "__main__":
    sys.exit(main())
