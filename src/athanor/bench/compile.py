"""`athanor bench compile`: one whole compile session, as a user runs it, and what it found.

The figures: the session's wall time against its budget, the candidates screened on the fast tier and confirmed on
the slow tier, the verified winner's speedup over the reference with its interval (device-seconds per 1,000
requests of the traffic), the winner's batch-1 decode step through `athanor bench decode`'s path, and the CPU time
of the session's own process (the driver: agents, store, statistics; on a cluster, the head's share of the work).
"""

from __future__ import annotations

import dataclasses
import logging
import resource
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from sqlalchemy import make_url

from athanor.bench.decode import decode_cell
from athanor.bench.record import default_device, default_dtype, provenance
from athanor.loop import CompileConfig, compile_session
from athanor.store.connect import database_url

log = logging.getLogger(__name__)


def bench_compile(config: CompileConfig, run_dir: str | Path | None = None, decode_context: int = 1024,
                  on_event: Callable[[str], None] = log.info) -> dict[str, Any]:
    """Run `config`'s session into `run_dir` (None: a temporary directory) and return the record; `decode_context`
    > 0 also times the winner's batch-1 decode step at that context. `on_event` receives the session's progress
    lines."""
    device = default_device(config.device)
    with tempfile.TemporaryDirectory(prefix="athanor-bench-compile-") as tmp:
        out = Path(run_dir) if run_dir else Path(tmp) / "run"
        config = dataclasses.replace(config, device=torch.device(device).type, out_dir=out)
        t, cpu = time.perf_counter(), _own_cpu_s()
        report = compile_session(config, on_event=on_event)
        wall_s, driver_cpu_s = time.perf_counter() - t, _own_cpu_s() - cpu
        summary = report.summary
        per_tier = summary.get("candidates_evaluated", {}).get("per_tier", {})
        record: dict[str, Any] = {
            "benchmark": "compile", "model": config.model, "traffic": config.traffic, "budget_s": config.budget_s,
            "agents": list(config.agents), "seed": config.seed, **provenance(device), "wall_s": wall_s,
            "driver_cpu_s": driver_cpu_s, "cluster": config.cluster,
            # The store's backend alone: a URL may carry a password.
            "store": make_url(database_url(config.store or out)).get_backend_name(),
            "screened": per_tier.get("fast", 0), "confirmed": per_tier.get("slow", 0),
            "verified": report.verified, "interrupted": report.interrupted, "winner_id": report.winner_id,
            "speedup": report.speedup, "reason": summary.get("reason", ""), "report": summary,
        }
        winner = out / "winner" / "candidate.py"
        if report.verified and decode_context > 0 and winner.is_file():
            dtype = default_dtype(device, config.dtype)
            record["winner_decode"] = decode_cell(config.model, 1, decode_context, str(winner), device=device,
                                                  dtype=dtype, iters=20, min_time_s=0.5)
    return record


def _own_cpu_s() -> float:
    """CPU seconds of this process, its threads included and its children not (the engine workers are children)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def summary_line(record: dict[str, Any]) -> str:
    """The session in one line: wall time, candidates, the driver's CPU share, and the winner's speedup and decode
    step."""
    where = f" on the cluster at {record['cluster']}" if record.get("cluster") else ""
    share = record["driver_cpu_s"] / max(record["wall_s"], 1e-9)
    head = (f"{record['model']} on {record['device_name']}{where}: {record['wall_s']:.0f} s for a "
            f"{record['budget_s']:.0f} s budget, {record['screened']} screened, {record['confirmed']} confirmed; "
            f"the driver used {record['driver_cpu_s']:.1f} CPU-s ({100 * share:.0f}% of a core)")
    if not record["verified"]:
        return f"{head}; no verified winner: {record['reason']}"
    s = record["speedup"]
    line = f"{head}; winner {record['winner_id']} x{s['median']:.3f} [{s['ci_low']:.3f}, {s['ci_high']:.3f}]"
    cell = record.get("winner_decode")
    if cell and cell.get("status") == "ok":
        line += f", batch-1 decode at context {cell['context']}: {cell['ms_per_token']:.3f} ms/token"
    return line
