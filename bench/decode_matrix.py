"""The decode matrix of issue 7 on one GPU: reference vs best-known candidate, and the reference
under torch.compile, for llama-3.2-1b, llama-3.1-8b and qwen3-30b-a3b (random weights, bf16;
qwen3's routing replayed from a profile, not uniform) at batch 1/8/32/128 x context 1k/8k/32k.

Split into parts that each end within 8 minutes (one model per part, loaded once; a part stops
starting cells after its time budget and records the rest as skipped). A failing cell is
recorded with its error and the others continue. Usage:

    python bench/decode_matrix.py --list                 # the parts and their cells
    python bench/decode_matrix.py --part 0               # one part (writes JSON under $OUT)
    python bench/decode_matrix.py --part all             # every part, one after another
    python bench/decode_matrix.py --table                # the table of every JSON under $OUT
    python bench/decode_matrix.py --merge A.json B.json ... --into M.json --markdown
                                                         # calls' cells in one file (a later cell replaces an
                                                         # earlier one of the same key), and its grid in Markdown
    python bench/decode_matrix.py --cells llama-3.2-1b:best:1:1024,llama-3.2-1b:reference+compile:1:1024
                                                         # ad-hoc cells (MODEL:CANDIDATE[+compile]:BATCH:CONTEXT)

$OUT defaults to bench/results. Each cell writes decode_<model>_<candidate>_b<B>_c<C>.json.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import torch

from athanor.moves.decode_bench import out_of_memory_in_step

BATCHES = (1, 8, 32, 128)
CONTEXTS = (1024, 8192, 32768)
COMPILE_BATCHES = (1, 32)
COMPILE_CONTEXTS = (1024, 32768)
PART_BUDGET_S = 7 * 60
"""A part starts no cell after this many seconds (its last cell must still end before 8 minutes)."""

Cell = tuple[str, str, bool, int, int]  # (model, candidate, compile, batch, context)


def _grid(model: str, candidate: str, use_compile: bool = False, batches=BATCHES, contexts=CONTEXTS) -> list[Cell]:
    return [(model, candidate, use_compile, b, c) for b in batches for c in contexts]


def _compile_cells(model: str, batches=COMPILE_BATCHES) -> list[Cell]:
    return _grid(model, "reference", True, batches, COMPILE_CONTEXTS)


PARTS: list[list[Cell]] = [
    _grid("llama-3.2-1b", "reference") + _grid("llama-3.2-1b", "best"),
    _compile_cells("llama-3.2-1b"),
    _grid("llama-3.1-8b", "reference"),
    _grid("llama-3.1-8b", "best"),
    _compile_cells("llama-3.1-8b", (1,)),
    _compile_cells("llama-3.1-8b", (32,)),
    _grid("qwen3-30b-a3b", "best"),
    _grid("qwen3-30b-a3b", "reference", batches=(1, 8)),
    _grid("qwen3-30b-a3b", "reference", batches=(32, 128)),
    _compile_cells("qwen3-30b-a3b", (1,)),
    _compile_cells("qwen3-30b-a3b", (32,)),
]


def cell_name(cell: Cell) -> str:
    model, candidate, use_compile, b, c = cell
    candidate = Path(candidate).stem if candidate.endswith(".py") else candidate
    return f"decode_{model}_{candidate}{'+compile' if use_compile else ''}_b{b}_c{c}"


def parse_cells(spec: str) -> list[Cell]:
    """Cells from "MODEL:CANDIDATE[+compile]:BATCH:CONTEXT,..." (e.g. llama-3.2-1b:reference+compile:1:1024)."""
    cells: list[Cell] = []
    for item in filter(None, (s.strip() for s in spec.split(","))):
        fields = item.split(":")
        if len(fields) != 4:
            raise SystemExit(f"--cells: {item!r} is not MODEL:CANDIDATE[+compile]:BATCH:CONTEXT")
        model, candidate, batch, context = fields
        use_compile = candidate.endswith("+compile")
        cells.append((model, candidate.removesuffix("+compile"), use_compile, int(batch), int(context)))
    return cells


def run_part(index: int, out: Path, routing: str | None) -> list[dict[str, Any]]:
    return run_cells(PARTS[index], out, routing, PART_BUDGET_S, part=index)


def run_cells(cells: list[Cell], out: Path, routing: str | None, budget_s: float,
              part: int | None = None, kernels: bool = False) -> list[dict[str, Any]]:
    """Time `cells` in order, loading each model once per run of consecutive cells of that model; no
    cell starts after `budget_s` seconds (the rest are recorded as skipped)."""
    from athanor.moves.decode_bench import bench_decode

    started = time.perf_counter()
    records: list[dict[str, Any]] = []
    loaded: tuple[str, Any, Any, str] | None = None  # (model name, model or None, routing profile, load error)
    model: Any = None
    for cell in cells:
        model_name, candidate, use_compile, batch, context = cell
        if loaded is None or loaded[0] != model_name:
            loaded = model = None  # free the previous model's weights before loading the next
            gc.collect()
            torch.cuda.empty_cache()
            loaded = _load(model_name, routing)
        _, model, profile, load_error = loaded
        base = {"benchmark": "decode", "model": model_name, "candidate": candidate, "compile": use_compile,
                "batch": batch, "context": context, "part": part}
        if model is None:
            record = {**base, "status": "error", "error": f"model did not load: {load_error}"}
        elif time.perf_counter() - started > budget_s:
            record = {**base, "status": "skipped", "error": f"ran out of its {budget_s:.0f} s budget"}
        else:
            t = time.perf_counter()
            try:
                record = bench_decode(model_name, batch, context, candidate=candidate, use_compile=use_compile,
                                      iters=10 if model.spec.moe is not None else 20, min_time_s=0.5,
                                      routing=routing, model=model, profile=profile, kernels=kernels)
                record["part"] = part
            except Exception as e:  # recorded, and the next cell runs
                record = {**base, "status": "error", "error": f"{type(e).__name__}: {e}",
                          "traceback": traceback.format_exc()[-4000:]}
            record["cell_s"] = time.perf_counter() - t
        gc.collect()
        torch.cuda.empty_cache()
        (out / f"{cell_name(cell)}.json").write_text(json.dumps(record, indent=2) + "\n")
        records.append(record)
        print(f"{'' if part is None else f'part {part}: '}{cell_name(cell)}: {record['status']} "
              f"{record.get('ms_per_token', float('nan')):.3f} ms", file=sys.stderr, flush=True)
    return records


def _load(model_name: str, routing: str | None) -> tuple[str, Any, Any, str]:
    """(name, model, its replayed routing profile or None, "") or (name, None, None, why it did not load): a model
    that fails fails its cells only."""
    from athanor.model.registry import load_model
    from athanor.moves.decode_bench import replay_routing

    try:
        model = load_model(model_name, device="cuda", dtype=torch.bfloat16)
        profile = None
        if model.spec.moe is not None:
            model, profile = replay_routing(model, routing, max_batch=max(BATCHES))
        return model_name, model, profile, ""
    except Exception as e:  # recorded for every cell of this model
        return model_name, None, None, f"{type(e).__name__}: {e}"


def load_or_say(model_name: str, routing: str | None) -> tuple[Any, Any] | None:
    """(model, replayed routing profile) for a one-model script (`step_tune.py`, `env_sweep.py`), or None after
    printing why it did not load."""
    _, model, profile, error = _load(model_name, routing)
    if model is None:
        print(f"error: {model_name} did not load: {error}", file=sys.stderr)
        return None
    return model, profile


def table(out: Path) -> str:
    """One line per cell: ms/token and share of roofline, or why there is none."""
    rows = []
    for path in sorted(out.glob("decode_*.json")):
        r = json.loads(path.read_text())
        if not isinstance(r, dict):  # decode_matrix_part*.json / decode_cells.json: lists of the cells' records
            continue
        label = r["candidate"] + ("+compile" if r.get("compile") else "")
        if r.get("status") == "ok":
            share = r.get("roofline_share")
            what = f"{r['ms_per_token']:9.3f} ms  {100 * share:5.1f}% roofline ({r['roofline_ms']:.3f} ms)" \
                if share else f"{r['ms_per_token']:9.3f} ms"
        elif r.get("status") == "does_not_fit":
            what = f"does not fit: KV {r['kv_cache_bytes'] / 2**30:.1f} GiB, free {r['free_bytes_before'] / 2**30:.1f} GiB"
            if out_of_memory_in_step(r):
                what += ", out of memory in the step"
        else:
            what = f"{r.get('status')}: {str(r.get('error', ''))[:80]}"
        rows.append(f"{r['model']:15s} {label:18s} b={r['batch']:<4d} ctx={r['context']:<6d} {what}")
    return "\n".join(rows)


def _key(r: dict[str, Any]) -> Cell:
    return r["model"], r["candidate"], bool(r.get("compile")), r["batch"], r["context"]


def merge(paths: list[Path]) -> list[dict[str, Any]]:
    """The cells of several calls' JSON lists (or single-cell records) in one list; a later cell replaces an
    earlier one with the same (model, candidate, compile, batch, context): a cell re-run after a fix."""
    cells: dict[Cell, dict[str, Any]] = {}
    for path in paths:
        data = json.loads(path.read_text())
        for r in data if isinstance(data, list) else [data]:
            cells[_key(r)] = r
    return list(cells.values())


def markdown(cells: list[dict[str, Any]]) -> str:
    """The matrix as bench/README.md shows it: a row per (model, candidate, context), a column per batch, each
    cell "ms/token (share of roofline)" or why there is none."""
    by_key = {_key(r): r for r in cells}

    def fmt(r: dict[str, Any] | None) -> str:
        if r is None:
            return ""
        if r["status"] == "ok":
            return f"{r['ms_per_token']:.3f} ({100 * r['roofline_share']:.0f}%)"
        if r["status"] == "does_not_fit":
            return "out of memory in its step" if out_of_memory_in_step(r) else "does not fit"
        return str(r["status"])

    weights: dict[str, int] = {}
    for r in cells:  # the smallest model first
        weights[r["model"]] = max(weights.get(r["model"], 0), r.get("weight_bytes", 0))
    models = sorted(weights, key=lambda m: weights[m])
    batches = sorted({r["batch"] for r in cells})
    lines = ["| model, candidate | context | " + " | ".join(f"batch {b}" for b in batches) + " |",
             "|---|---|" + "---|" * len(batches)]
    for model in models:
        for candidate, compiled in (("best", False), ("reference", False), ("reference", True)):
            for context in sorted({r["context"] for r in cells}):
                row = [by_key.get((model, candidate, compiled, b, context)) for b in batches]
                if any(row):
                    label = f"{model} {candidate}{' + torch.compile' if compiled else ''}"
                    lines.append(f"| {label} | {context // 1024}k | " + " | ".join(fmt(r) for r in row) + " |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--part", default=None, help="part index, or 'all'")
    parser.add_argument("--list", action="store_true", help="print the parts and exit")
    parser.add_argument("--table", action="store_true", help="print the table of the results under $OUT")
    parser.add_argument("--routing", default="", help="RoutingProfile JSON for qwen3 (default: Zipf-parametric)")
    parser.add_argument("--cells", default="", help="ad-hoc cells MODEL:CANDIDATE[+compile]:BATCH:CONTEXT,...")
    parser.add_argument("--budget", type=float, default=PART_BUDGET_S, help="--cells: start no cell after this "
                                                                            "many seconds")
    parser.add_argument("--kernels", action="store_true", help="--cells: also profile each cell's step per kernel")
    parser.add_argument("--merge", nargs="+", type=Path, default=[], help="calls' JSON files to merge (with --into)")
    parser.add_argument("--into", type=Path, default=None, help="--merge: the merged file")
    parser.add_argument("--markdown", action="store_true", help="--merge: print the merged grid in Markdown")
    args = parser.parse_args()
    if args.merge:
        missing = [str(p) for p in args.merge if not p.is_file()]
        if missing or args.into is None:
            print(f"--merge: no such file: {', '.join(missing)}" if missing else "--merge needs --into FILE",
                  file=sys.stderr)
            return 2
        cells = merge(args.merge)
        args.into.write_text(json.dumps(cells, indent=1) + "\n")
        print(f"{len(cells)} cells -> {args.into}")
        if args.markdown:
            print(markdown(cells))
        return 0
    out = Path(os.environ.get("OUT") or Path(__file__).parent / "results")
    out.mkdir(parents=True, exist_ok=True)
    if args.list:
        for i, cells in enumerate(PARTS):
            print(f"part {i}: {len(cells)} cells: " + ", ".join(cell_name(c) for c in cells))
        return 0
    if args.cells:
        if not torch.cuda.is_available():
            print("decode_matrix needs a CUDA device", file=sys.stderr)
            return 2
        records = run_cells(parse_cells(args.cells), out, args.routing or None, args.budget, kernels=args.kernels)
        (out / "decode_cells.json").write_text(json.dumps(records, indent=2) + "\n")
    elif args.part is not None:
        if not torch.cuda.is_available():
            print("decode_matrix needs a CUDA device", file=sys.stderr)
            return 2
        parts = range(len(PARTS)) if args.part == "all" else [int(args.part)]
        for i in parts:
            records = run_part(i, out, args.routing or None)
            (out / f"decode_matrix_part{i}.json").write_text(json.dumps(records, indent=2) + "\n")
    print(table(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
