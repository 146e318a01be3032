"""Benchmark: profile synthetic 1,000,000-row traces (Mooncake JSONL, Azure CSV, BurstGPT CSV).

Target (issue 3): under 10 s and under 500 MB RSS for each, on the 2-core dev machine. Each
profile runs in a fresh process, so its peak RSS is the profiler's alone; the load average
before each run is recorded, since the machine is shared and timings move with it.
Writes bench/results/traffic_profile.json.

    python bench/traffic_profile.py [ROWS]
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

TARGET_S, TARGET_MB = 10.0, 500.0


def _lengths(rng: np.random.Generator, num_rows: int) -> tuple[np.ndarray, np.ndarray]:
    n_in = np.clip(rng.lognormal(np.log(7000), 1.2, num_rows), 1, 128000).astype(np.int64)
    n_out = np.clip(rng.lognormal(np.log(300), 0.8, num_rows), 1, 4000).astype(np.int64)
    return n_in, n_out


def write_mooncake(path: Path, num_rows: int, seed: int = 0) -> None:
    """Mooncake layout: ms timestamps (~3.3 req/s), hash_ids of 512-token blocks, a few shared
    system-prompt blocks (ids 0-1) and otherwise fresh ids (~28 blocks a row)."""
    rng = np.random.default_rng(seed)
    t = np.cumsum(rng.exponential(300.0, num_rows)).astype(np.int64)
    n_in, n_out = _lengths(rng, num_rows)
    num_blocks = -(-n_in // 512)
    shared = np.minimum(num_blocks, rng.integers(0, 3, num_rows))
    fresh = 1000 + np.cumsum(num_blocks - shared) - (num_blocks - shared)
    with open(path, "w") as f:
        for i in range(num_rows):
            ids = list(range(int(shared[i]))) + list(range(int(fresh[i]), int(fresh[i] + num_blocks[i] - shared[i])))
            f.write(f'{{"timestamp": {t[i]}, "input_length": {n_in[i]}, "output_length": {n_out[i]}, '
                    f'"hash_ids": {ids}}}\n')


def write_azure(path: Path, num_rows: int, seed: int = 1) -> None:
    """Azure LLM 2023 layout: `TIMESTAMP,ContextTokens,GeneratedTokens`, 100 ns ISO timestamps."""
    rng = np.random.default_rng(seed)
    t = np.datetime64("2023-11-16T18:00:00", "ns") + np.cumsum(rng.exponential(0.3e9, num_rows)).astype("m8[ns]")
    stamps = np.datetime_as_string(t, unit="ns")
    n_in, n_out = _lengths(rng, num_rows)
    with open(path, "w") as f:
        f.write("TIMESTAMP,ContextTokens,GeneratedTokens\n")
        f.writelines(f"{s[:10]} {s[11:27]},{a},{b}\n" for s, a, b in zip(stamps, n_in.tolist(), n_out.tolist(),
                                                                       strict=True))


def write_burstgpt(path: Path, num_rows: int, seed: int = 2) -> None:
    """BurstGPT layout: `Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type`."""
    rng = np.random.default_rng(seed)
    t = np.cumsum(rng.exponential(0.3, num_rows))
    n_in, n_out = _lengths(rng, num_rows)
    model = np.where(rng.random(num_rows) < 0.7, "ChatGPT", "GPT-4")
    kind = np.where(rng.random(num_rows) < 0.8, "Conversation log", "API log")
    with open(path, "w") as f:
        f.write("Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n")
        f.writelines(f"{ts:.0f},{m},{a},{b},{a + b},{k}\n" for ts, m, a, b, k in zip(
            t.tolist(), model.tolist(), n_in.tolist(), n_out.tolist(), kind.tolist(), strict=True))


WRITERS = {"mooncake": (write_mooncake, ".jsonl"), "azure": (write_azure, ".csv"), "burstgpt": (write_burstgpt, ".csv")}
PROFILE = (
    "import time,resource,sys,json; from athanor.traffic.profile import profile_trace; "
    "t=time.perf_counter(); p=profile_trace(sys.argv[1], window_s=600); s=time.perf_counter()-t; "
    "print(json.dumps({'seconds': s, 'rss_mb': resource.getrusage(resource.RUSAGE_SELF).ru_maxrss/1024, "
    "'num_requests': p.num_requests, 'input_mean': p.input.mean, 'output_mean': p.output.mean, "
    "'num_windows': len(p.windows), 'prefix_hit_share': p.prefix.hit_share if p.prefix else None}))"
)


def main() -> int:
    num_rows = int(sys.argv[1]) if len(sys.argv) > 1 else 1_000_000
    results = []
    with tempfile.TemporaryDirectory() as d:
        for fmt in WRITERS:
            writer, suffix = WRITERS[fmt]
            path = Path(d) / f"{fmt}{suffix}"
            t0 = time.perf_counter()
            writer(path, num_rows)
            gen_s = time.perf_counter() - t0
            size_mb = path.stat().st_size / 2**20
            load = os.getloadavg()
            out = subprocess.run([sys.executable, "-c", PROFILE, str(path)], capture_output=True, text=True,
                                 check=True)
            res = json.loads(out.stdout)
            path.unlink()
            results.append({"format": fmt, "rows": num_rows, "file_mb": round(size_mb, 1),
                            "generate_s": round(gen_s, 1), "load_avg_1m_before": round(load[0], 2), **res,
                            "pass": res["seconds"] < TARGET_S and res["rss_mb"] < TARGET_MB})
            print(json.dumps(results[-1]), flush=True)
    import scipy
    import torch

    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                                cwd=Path(__file__).parent).stdout.strip()
        dirty = bool(subprocess.run(["git", "status", "--porcelain", "src/athanor/traffic"], capture_output=True,
                                    text=True, cwd=Path(__file__).parent).stdout.strip())
    except OSError:
        commit, dirty = "", False
    result = {
        "benchmark": "traffic_profile", "target": {"seconds": TARGET_S, "rss_mb": TARGET_MB},
        "runs": results, "pass": all(r["pass"] for r in results),
        "machine": {"cpu": platform.processor() or platform.machine(), "cpu_count": os.cpu_count(),
                    "python": platform.python_version(), "numpy": np.__version__, "scipy": scipy.__version__,
                    "torch": torch.__version__, "gpu": None},
        "commit": (commit or "unknown") + ("+uncommitted src/athanor/traffic changes" if dirty else ""),
        "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    out_path = Path(__file__).parent / "results" / "traffic_profile.json"
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    return 0 if result["pass"] else 1


if __name__ == "__main__":
    sys.exit(main())
