"""`athanor bench reference`: the reference forward is no straw man.

Its CPU decode against HF transformers' eager decode with a static cache: the same model and weights (one HF
directory both sides load), the same prompt, the same number of greedy decode steps and the same KV capacity.
Each side runs in a fresh process, the sides interleaved `repeats` times, so neither inherits the other's
allocator or thread-pool state; the figure is each side's median tokens/s.
"""

from __future__ import annotations

import importlib.util
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

import torch

from athanor.bench.record import provenance
from athanor.errors import ConfigError
from athanor.model import BuildContext, DecodeBatch, Model, make_prefill_batch

SIDES = ("athanor_reference", "hf_eager_static_cache")
TEXT = "The quick brown fox jumps over the lazy dog. " * 64


@torch.inference_mode()
def reference_tokens_per_s(model: Model, ids: list[int], steps: int, max_len: int) -> float:
    """Greedy decode tokens/s of athanor's reference forward, after a prefill of `ids`."""
    from athanor.model.reference import build

    fwd = build(model, BuildContext(torch.device("cpu"), torch.float32, max_seqs=1, max_seq_len=max_len))
    tok = int(fwd.prefill(make_prefill_batch([ids], [0])).argmax())
    n = len(ids)
    start = time.perf_counter()
    for i in range(steps):
        pos = torch.tensor([n + i])
        tok = int(fwd.decode(DecodeBatch(torch.tensor([tok]), pos, torch.tensor([0]), pos)).argmax())
    return steps / (time.perf_counter() - start)


@torch.inference_mode()
def hf_tokens_per_s(directory: str, ids: list[int], steps: int, max_len: int) -> float:
    """Greedy decode tokens/s of HF transformers (eager attention, static cache) on the model in `directory`."""
    from transformers import AutoModelForCausalLM, StaticCache

    hf = AutoModelForCausalLM.from_pretrained(directory, torch_dtype=torch.float32, attn_implementation="eager").eval()
    cache = StaticCache(config=hf.config, max_cache_len=max_len)
    n = len(ids)
    out = hf(torch.tensor([ids]), past_key_values=cache, cache_position=torch.arange(n), use_cache=True)
    tok = int(out.logits[0, -1].argmax())
    start = time.perf_counter()
    for i in range(steps):
        pos = torch.tensor([n + i])
        out = hf(torch.tensor([[tok]]), past_key_values=cache, cache_position=pos, position_ids=pos[None],
                 use_cache=True)
        tok = int(out.logits[0, -1].argmax())
    return steps / (time.perf_counter() - start)


def one_side(side: str, directory: str, ids: list[int], steps: int) -> float:
    """Decode tokens/s of one side, in this process."""
    max_len = len(ids) + steps
    if side == "athanor_reference":
        from athanor.model.registry import load_model

        return reference_tokens_per_s(load_model(directory, dtype=torch.float32), ids, steps, max_len)
    return hf_tokens_per_s(directory, ids, steps, max_len)


def bench_reference(model: str = "smollm2-135m", steps: int = 64, prompt_len: int = 128,
                    repeats: int = 3) -> dict[str, Any]:
    """Both sides `repeats` times, interleaved, each in a fresh process; the record."""
    if importlib.util.find_spec("transformers") is None:
        raise ConfigError("athanor bench reference compares against HF transformers, which is not installed: "
                          "pip install -e '.[test]'")
    if min(steps, prompt_len, repeats) < 1:
        raise ConfigError("--steps, --prompt-len and --repeats must be at least 1")
    from athanor.model.hf import save_hf
    from athanor.model.registry import load_model_and_tokenizer

    loaded, tokenizer = load_model_and_tokenizer(model, dtype=torch.float32)
    vocab = loaded.spec.vocab_size
    # A model without a tokenizer (a random preset) reads the text's bytes as ids.
    ids = tokenizer.encode(TEXT) if tokenizer is not None else [b % (vocab - 1) + 1 for b in TEXT.encode()]
    ids = ids[:prompt_len]
    runs: dict[str, list[float]] = {side: [] for side in SIDES}
    with tempfile.TemporaryDirectory(prefix="athanor-bench-reference-") as tmp:
        save_hf(loaded, tmp)
        del loaded
        for _ in range(repeats):
            for side in SIDES:
                done = subprocess.run([sys.executable, "-m", "athanor.bench.reference", side, tmp, str(steps),
                                       ",".join(map(str, ids))], capture_output=True, text=True)
                if done.returncode != 0:
                    raise RuntimeError(f"{side} failed: {done.stderr.strip()[-2000:]}")
                runs[side].append(float(done.stdout.strip().splitlines()[-1]))
    tokens_per_s = {side: statistics.median(v) for side, v in runs.items()}
    return {"benchmark": "reference", "model": model, "dtype": "float32", "prompt_len": len(ids),
            "decode_steps": steps, "kv_capacity": len(ids) + steps, "load_average": os.getloadavg(),
            **provenance("cpu"), "tokens_per_s": tokens_per_s, "runs": runs,
            "ratio": tokens_per_s["athanor_reference"] / tokens_per_s["hf_eager_static_cache"]}


def summary_lines(record: dict[str, Any]) -> list[str]:
    """The two sides' tokens/s and their ratio, as a two-line table."""
    tps = record["tokens_per_s"]
    return [f"{'decode tok/s (median)':28s} {'athanor reference':>18s} {'HF eager static':>16s} {'ratio':>6s}",
            f"{record['model'] + ' fp32 CPU':28s} {tps['athanor_reference']:18.1f} "
            f"{tps['hf_eager_static_cache']:16.1f} {record['ratio']:6.2f}"]


if __name__ == "__main__":  # one side, in the fresh process `bench_reference` starts
    side, directory, steps, ids = sys.argv[1:5]
    torch.set_grad_enabled(False)
    print(one_side(side, directory, [int(i) for i in ids.split(",")], int(steps)))
