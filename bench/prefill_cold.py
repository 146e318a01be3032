"""Cold and warm runs of the reference prefill at lengths it has not seen (issue 6: the fast tier's prefill noise).

The tier benchmark's eager prefill read an incumbent run-to-run spread of up to 200% early in each device call
and ~1-3% late in it. The prefill scripts jitter each step's length (1536-2048 tokens), so early steps run
lengths the process has not seen; this times a first (cold) run of a length against the second and third
(warm) runs, with torch's own SDPA choice and forced to flash attention, and names the kernels of a cold run.
The reference's prefill now restricts SDPA itself (`athanor.model.reference.PREFILL_SDPA`, after this script's
first run at e173720); the script calls the layers under it (`ReferenceForward._prefill`) to time torch's choice.

    python bench/prefill_cold.py [--model llama-3.1-8b] [--layers 6] [--lengths 10]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import time

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from athanor.model.reference import ReferenceForward
from athanor.model.registry import load_model
from athanor.model.seam import BuildContext, make_prefill_batch


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="llama-3.1-8b")
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--lengths", type=int, default=10)
    args = ap.parse_args()
    dev = torch.device("cuda")
    model = load_model(args.model, device="cuda", dtype=torch.bfloat16).slice(args.layers)
    fwd = ReferenceForward(model, BuildContext(dev, torch.bfloat16, 4, 4096))
    vocab = model.spec.vocab_size
    rng = random.Random(0)
    used: set[int] = set()

    def run(n: int) -> tuple[float, float]:
        batch = make_prefill_batch([[rng.randrange(vocab) for _ in range(n)]], [0], device=dev)
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        t0 = time.perf_counter()
        start.record()
        fwd._prefill(batch)  # without the reference's own backend choice (see the module docstring)
        host = time.perf_counter() - t0
        end.record()
        torch.cuda.synchronize()
        return start.elapsed_time(end), 1e3 * host

    def fresh() -> int:
        while True:
            n = rng.randrange(1536, 2048)
            if n not in used:
                used.add(n)
                return n

    torch.set_grad_enabled(False)
    run(1024)
    run(1024)
    rows = []
    for backend in ("default", "flash", "default-again"):
        for _ in range(args.lengths):
            n = fresh()
            ctx = sdpa_kernel(SDPBackend.FLASH_ATTENTION) if backend == "flash" else contextlib.nullcontext()
            with ctx:
                times = [run(n) for _ in range(3)]
            rows.append({"backend": backend, "tokens": n, "device_ms": [t for t, _ in times],
                         "host_ms": [h for _, h in times]})
            print(f"{backend:14s} {n:5d}  device ms " + " ".join(f"{t:8.2f}" for t, _ in times)
                  + "   host ms " + " ".join(f"{h:7.2f}" for _, h in times), flush=True)
    from torch.profiler import ProfilerActivity, profile

    n = fresh()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        run(n)
    table = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=14, max_name_column_width=60)
    print(table)
    cuda_table = prof.key_averages().table(sort_by="self_cuda_time_total", row_limit=10, max_name_column_width=60)
    print(cuda_table)
    out = os.environ.get("OUT", "bench/results")
    with open(os.path.join(out, "prefill_cold.json"), "w") as f:
        json.dump({"benchmark": "prefill_cold", "model": args.model, "layers": args.layers, "rows": rows,
                   "gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
                   "commit": os.environ.get("ATHANOR_COMMIT", "")}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
