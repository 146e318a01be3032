"""No straw man: the reference forward's CPU decode against HF transformers' eager decode with a static cache.

Same model (smollm2-135m, fp32, the same dequantized weights), same prompt, same number of
decode steps, same KV capacity. Usage:

    .venv/bin/python bench/reference.py [--steps 64] [--prompt-len 128] [--json bench/results/reference_cpu.json]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

from _record import write
from athanor.model import BuildContext, DecodeBatch, make_prefill_batch
from athanor.model.reference import build
from athanor.model.registry import _converted_dir, load_model_and_tokenizer

SIDES = ("athanor_reference", "hf_eager_static_cache")
TEXT = "The quick brown fox jumps over the lazy dog. " * 64


@torch.inference_mode()
def ours(model, ids: list[int], steps: int, max_len: int) -> float:
    fwd = build(model, BuildContext(torch.device("cpu"), torch.float32, max_seqs=1, max_seq_len=max_len))
    tok = int(fwd.prefill(make_prefill_batch([ids], [0])).argmax())
    n = len(ids)
    start = time.perf_counter()
    for i in range(steps):
        pos = torch.tensor([n + i])
        tok = int(fwd.decode(DecodeBatch(torch.tensor([tok]), pos, torch.tensor([0]), pos)).argmax())
    return steps / (time.perf_counter() - start)


@torch.inference_mode()
def hf_static(hf, ids: list[int], steps: int, max_len: int) -> float:
    from transformers import StaticCache

    cache = StaticCache(config=hf.config, max_cache_len=max_len)
    n = len(ids)
    out = hf(torch.tensor([ids]), past_key_values=cache, cache_position=torch.arange(n), use_cache=True)
    tok = int(out.logits[0, -1].argmax())
    start = time.perf_counter()
    for i in range(steps):
        pos = torch.tensor([n + i])
        out = hf(torch.tensor([[tok]]), past_key_values=cache, cache_position=pos, position_ids=pos[None], use_cache=True)
        tok = int(out.logits[0, -1].argmax())
    return steps / (time.perf_counter() - start)


def one_side(side: str, steps: int, prompt_len: int) -> float:
    """Decode tok/s of one side, in this process (the parent runs each side in a fresh process)."""
    model, tokenizer = load_model_and_tokenizer("smollm2-135m")
    assert tokenizer is not None
    ids = tokenizer.encode(TEXT)[:prompt_len]
    max_len = prompt_len + steps
    if side == "athanor_reference":
        return ours(model, ids, steps, max_len)
    from transformers import AutoModelForCausalLM

    # HF loads the very same fp32 weights (athanor's converted copy of the GGUF), eager attention.
    hf = AutoModelForCausalLM.from_pretrained(str(_converted_dir()), torch_dtype=torch.float32,
                                              attn_implementation="eager").eval()
    return hf_static(hf, ids, steps, max_len)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=64)
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--side", choices=SIDES, help=argparse.SUPPRESS)
    ap.add_argument("--json", default=str(Path(__file__).parent / "results" / "reference_cpu.json"))
    args = ap.parse_args()
    if args.side:
        print(one_side(args.side, args.steps, args.prompt_len))
        return
    rows: dict[str, list[float]] = {side: [] for side in SIDES}
    for _ in range(args.repeats):  # interleaved fresh processes: neither side inherits the other's state
        for side in SIDES:
            done = subprocess.run([sys.executable, __file__, "--side", side, "--steps", str(args.steps),
                                   "--prompt-len", str(args.prompt_len)], capture_output=True, text=True, check=True)
            rows[side].append(float(done.stdout.strip().splitlines()[-1]))
    result = {
        "benchmark": "reference_vs_hf_cpu_decode",
        "model": "smollm2-135m", "dtype": "float32", "prompt_len": args.prompt_len, "decode_steps": args.steps,
        "kv_capacity": args.prompt_len + args.steps, "load_average": os.getloadavg(),
        "tokens_per_s": {k: statistics.median(v) for k, v in rows.items()}, "runs": rows,
    }
    path = write(result, args.json)
    tps = result["tokens_per_s"]
    print(f"{'decode tok/s (median)':28s} {'athanor reference':>18s} {'HF eager static':>16s} {'ratio':>6s}")
    print(f"{'smollm2-135m fp32 CPU':28s} {tps['athanor_reference']:18.1f} {tps['hf_eager_static_cache']:16.1f} "
          f"{tps['athanor_reference'] / tps['hf_eager_static_cache']:6.2f}")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
