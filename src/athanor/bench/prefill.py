"""`athanor bench prefill`: time to first token of one long prompt alone, and the FLOP/s it reaches.

The model is loaded once; each candidate is swapped into an `Engine` with one slot of the longest prompt, and each
prompt is prefilled in chunks of `chunk` tokens, one `prefill` call after the other as the server's scheduler
issues them for a prompt alone, then its first token sampled (greedy). The figure is the wall time from the
first chunk to that token, the median of `repeats` after one warm-up of the same length.

FLOPs counted as the evaluator's objective counts them (`objective.prefill_flops`): every linear layer's 2 x rows x
in x out (an MoE layer's top-k experts; the LM head for the last token only) and causal attention's
2 x 2 x heads x head_dim x (n^2 / 2) per layer (QK^T and PV over the keys each query sees).
"""

from __future__ import annotations

import functools
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

from athanor.bench.decode import (
    COMPILE_SUFFIX,
    candidate_source,
    guarded_cell,
    load_for_decode,
    parse_candidates,
)
from athanor.bench.record import default_device, default_dtype, provenance
from athanor.errors import ConfigError
from athanor.evaluate.objective import prefill_flops
from athanor.model import PrefillBatch


def _prefill_once(forward: Any, tokens: torch.Tensor, chunk: int, dev: torch.device) -> float:
    """Seconds from the first chunk to the first token of `tokens` prefilled into slot 0."""
    n = int(tokens.shape[0])
    slot = torch.zeros(1, dtype=torch.long, device=dev)
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    t = time.perf_counter()
    for start in range(0, n, chunk):
        piece = tokens[start:start + chunk]
        k = int(piece.shape[0])
        batch = PrefillBatch(piece, torch.tensor([0, k], dtype=torch.long, device=dev),
                             torch.arange(start, start + k, dtype=torch.long, device=dev), slot,
                             torch.tensor([start], dtype=torch.long, device=dev))
        logits = forward.prefill(batch)
    int(logits.argmax(-1)[0])  # the first token on the host, as the server has it
    return time.perf_counter() - t


def prefill_cell(model: Any, model_name: str, lengths: Sequence[int], candidate: str, use_compile: bool,
                 device: str, dtype: str, chunk: int, repeats: int,
                 on_length: Callable[[int], None] | None = None) -> dict[str, Any]:
    """One candidate over every prompt length; its JSON-ready record. `on_length(n)` is called before the prompt
    length `n` is timed (outside the timing)."""
    from athanor.engine import protocol as p
    from athanor.engine.candidate import Candidate
    from athanor.engine.config import EngineConfig
    from athanor.engine.core import Engine

    dev = torch.device(device)
    spec = model.spec
    source, label = candidate_source(candidate, spec, use_compile, device)
    record: dict[str, Any] = {"candidate": candidate, "candidate_label": label, "compile": use_compile, "runs": []}
    with tempfile.TemporaryDirectory(prefix="athanor-bench-prefill-") as tmp:
        config = EngineConfig(model=model_name, device=device, dtype=dtype, max_seqs=1, max_seq_len=max(lengths) + 16,
                              buckets=(1,), scratch_dir=tmp)
        engine = Engine(config, model)
        try:
            reply = engine.swap(p.SwapRequest(Candidate.from_source(source, description=label)))
            if reply.status != "ok":
                record.update(status="error", error=reply.error[-2000:])
                return record
            forward = engine.residents[reply.candidate_id].forward
            gen = torch.Generator().manual_seed(0)
            for n in lengths:
                if on_length is not None:
                    on_length(n)
                tokens = torch.randint(0, spec.vocab_size, (n,), generator=gen).to(dev)
                _prefill_once(forward, tokens, chunk, dev)  # warm-up: kernels compiled and tuned for these shapes
                times = [_prefill_once(forward, tokens, chunk, dev) for _ in range(repeats)]
                ttft = statistics.median(times)
                flops = prefill_flops(spec, spec.num_layers, n, 0)
                record["runs"].append({"tokens": n, "ttft_s": ttft, "times_s": times, "flops": flops,
                                       "tflops": flops / ttft / 1e12})
        finally:
            engine.close()
    record["status"] = "ok"
    return record


def bench_prefill(model_name: str, lengths: Sequence[int], candidates: str = "best", device: str | None = None,
                  dtype: str = "", chunk: int = 8192, repeats: int = 3,
                  status: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Every candidate x prompt length, the model loaded once; one record with a `cells` list. `status` is told
    what runs (the model's load, then each candidate and prompt length, with how many are done) between timings."""
    if not lengths or min(lengths) < 1 or chunk < 1 or repeats < 1:
        raise ConfigError("--tokens, --chunk and --repeats must be at least 1")
    device = default_device(device)
    dtype = default_dtype(device, dtype)
    chosen = parse_candidates(candidates)
    record: dict[str, Any] = {"benchmark": "prefill", "model": model_name, "dtype": dtype, "chunk": chunk,
                              "repeats": repeats, **provenance(device)}
    show = status or (lambda text: None)
    show(f"loading {model_name}")
    model, _ = load_for_decode(model_name, device, dtype)
    cells: list[dict[str, Any]] = []
    total, begun = len(chosen) * len(lengths), 0
    for candidate, compiled in chosen:
        label = candidate + (COMPILE_SUFFIX if compiled else "")

        def on_length(n: int, label: str = label) -> None:
            nonlocal begun
            begun += 1
            show(f"prompt {begun} of {total}: {model_name} {label}, {n} tokens")

        cells.append(guarded_cell(
            functools.partial(prefill_cell, model, model_name, lengths, candidate, compiled, device, dtype, chunk,
                              repeats, on_length),
            {"candidate": candidate, "compile": compiled}, device))
    record["cells"] = cells
    return record


def prefill_lines(record: dict[str, Any]) -> list[str]:
    """One line per candidate and prompt length: its TTFT and TFLOP/s, or why there is none."""
    lines = []
    for cell in record["cells"]:
        label = cell.get("candidate_label", cell["candidate"])
        if cell["status"] != "ok":
            why = (str(cell.get("error", "")).strip().splitlines() or [""])[-1]
            lines.append(f"{record['model']} {label}: {cell['status']}: {why}")
            continue
        for run in cell["runs"]:
            lines.append(f"{record['model']} {label} prompt {run['tokens']} (chunks of {record['chunk']}): TTFT "
                         f"{run['ttft_s']:.3f} s, {run['tflops']:.0f} TFLOP/s")
    return lines
