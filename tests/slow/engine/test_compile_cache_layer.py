"""An untrusted worker compiles into a layer of its own: the fast template compiled by Inductor (flex attention
included) builds and runs, its entries land in the worker's layer and none in the shared cache. Tens of seconds
of Inductor on a CPU: slow tier (the cheap half, that a candidate cannot write the shared cache, is in
tests/unit/engine/test_isolation.py)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from athanor.engine.candidate import Candidate
from athanor.engine.config import EngineConfig
from athanor.engine.supervisor import Supervisor, Timeouts
from athanor.moves import render

pytestmark = pytest.mark.slow

CONFIG = EngineConfig(model="tiny-dense", max_seqs=4, max_seq_len=64, buckets=(1, 2, 4), cpu_threads=1)


def test_an_untrusted_worker_compiles_into_its_own_layer(tmp_path: Path) -> None:
    shared = tmp_path / "shared-cache"
    shared.mkdir()
    (shared / "seed.txt").write_text("from a trusted worker")
    config = dataclasses.replace(CONFIG, cache_dir=str(shared))
    with Supervisor(config, Timeouts(start_s=120, swap_s=300, run_s=30, other_s=30)) as sup:
        sup.start()
        line = next(x for x in sup.health().sandbox if x.startswith("compile cache:"))
        assert "read-only (overlay)" in line, line
        compiled = Candidate.from_source(render("fast", {"compile": "default", "fused_qkv": True}))
        assert sup.swap(compiled, keep_incumbent=True).status == "ok"
        assert sup.generate([[3, 1, 4]], 4).status == "ok"
        worker = sup.worker_pid
        own = Path(sup.config.scratch_dir)
        layers = list(Path(f"/proc/{worker}/root{own}").rglob("inductor"))
        assert layers and any(list(d.iterdir()) for d in layers if d.is_dir())  # its entries, in its own layer
        assert sorted(x.name for x in shared.iterdir()) == ["seed.txt"]  # and nothing in the shared cache
