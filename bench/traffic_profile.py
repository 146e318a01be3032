"""Benchmark: profile a synthetic 1,000,000-row Mooncake-style trace; time and peak RSS.

Target (issue 3): under 10 s and under 500 MB RSS. Writes bench/results/traffic_profile.json.
"""

from __future__ import annotations

import json
import platform
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np


def write_trace(path: Path, num_rows: int, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    t = np.cumsum(rng.exponential(300.0, num_rows)).astype(np.int64)  # ms, ~3.3 req/s
    n_in = np.clip(rng.lognormal(np.log(7000), 1.2, num_rows), 1, 128000).astype(np.int64)
    n_out = np.clip(rng.lognormal(np.log(300), 0.8, num_rows), 1, 4000).astype(np.int64)
    next_id = 1000
    with open(path, "w") as f:
        for i in range(num_rows):
            nb = -(-int(n_in[i]) // 512)
            shared = min(nb, int(rng.integers(0, 3)))  # a few system-prompt blocks shared
            ids = list(range(shared)) + list(range(next_id, next_id + nb - shared))
            next_id += nb - shared
            f.write(f'{{"timestamp": {t[i]}, "input_length": {n_in[i]}, "output_length": {n_out[i]}, '
                    f'"hash_ids": {ids}}}\n')


def main() -> int:
    num_rows = int(sys.argv[1]) if len(sys.argv) > 1 else 1_000_000
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "trace.jsonl"
        t0 = time.perf_counter()
        write_trace(path, num_rows)
        gen_s = time.perf_counter() - t0
        size = path.stat().st_size
        # Profile in a fresh process so the peak RSS is the profiler's alone.
        code = ("import time,resource,sys,json; from athanor.traffic.profile import profile_trace; "
                "t=time.perf_counter(); p=profile_trace(sys.argv[1], window_s=600); s=time.perf_counter()-t; "
                "print(json.dumps({'seconds': s, 'rss_mb': resource.getrusage(resource.RUSAGE_SELF).ru_maxrss/1024, "
                "'num_requests': p.num_requests, 'input_mean': p.input.mean}))")
        out = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, check=True)
        res = json.loads(out.stdout)
    import scipy
    import torch

    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    except OSError:
        commit = ""
    result = {
        "benchmark": "traffic_profile", "rows": num_rows, "file_mb": size / 2**20, "generate_s": gen_s, **res,
        "pass": res["seconds"] < 10 and res["rss_mb"] < 500,
        "machine": {"cpu": platform.processor() or platform.machine(), "python": platform.python_version(),
                    "numpy": np.__version__, "scipy": scipy.__version__, "torch": torch.__version__,
                    "gpu": None},
        "commit": commit or "uncommitted",
    }
    out_path = Path(__file__).parent / "results" / "traffic_profile.json"
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(json.dumps(result, indent=2))
    print(json.dumps(result, indent=2))
    _ = resource
    return 0 if result["pass"] else 1


if __name__ == "__main__":
    sys.exit(main())
