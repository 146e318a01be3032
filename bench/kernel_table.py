"""Print the per-kernel summary of the `decode_*_b1_c1024.json` cells under a folder (what the bench/gpu_*.sh
device scripts show last): step time, kernel time and launches, the top kernels of each cell, and its critical path.

    python bench/kernel_table.py DIR [TOP]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def main(folder: str, top: int = 9) -> None:
    for f in sorted(Path(folder).glob("decode_*_b1_c1024.json")):
        r = json.loads(f.read_text())
        if "kernels" not in r:
            print(f.stem, r.get("status"), r.get("error", "")[-300:])
            continue
        print(f"\n{f.stem}: {r['ms_per_token']:.3f} ms/token, kernels {r['kernel_us_per_step']:.0f} us "
              f"({r['kernel_count_per_step']:.0f} launches), gaps {r['gap_us_per_step']:.0f} us")
        for k in r["kernels"][:top]:
            print(f"  {k['us_per_step']:8.1f} us  x{k['calls_per_step']:5.1f}  {k['name'][:90]}")
        if "path" in r:  # each kernel's share of the wall (decode_bench.critical_path)
            print(f"  critical path {r['path_us_per_step']:.0f} us a step, of which gaps {r['path_gap_us_per_step']:.1f} us:")
            for k in r["path"][:2 * top]:
                print(f"  {k['us_per_step']:8.1f} us  x{k['calls_per_step']:5.1f}  {k['name'][:90]}")


if __name__ == "__main__":
    main(sys.argv[1], *(int(a) for a in sys.argv[2:3]))
