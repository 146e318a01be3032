"""The template as pieces computes what it computed as one file (`templates/fast.py`): every option's every value,
the best-known sets and the fused layer's paths, each rendered from the pieces and from the one-file template, run
on the same random 2-layer model in fp32 on the CPU (Triton in its interpreter). Minutes: slow tier.

Up to fp32 rounding, not bit for bit: the pieces' prefill attends for the whole batch in one call (padded, with a
mask) where the one-file template looped over sequences, which rounds differently, and the cache that prefill leaves
carries the difference into the decode steps after it. The routing each MoE layer saw must still be identical."""

from __future__ import annotations

import dataclasses
import importlib.util
import itertools
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from athanor.model import BuildContext, DecodeBatch, ModelSpec, make_prefill_batch
from athanor.model.presets import PRESETS
from athanor.model.random_init import random_model
from athanor.moves import MOVES, best_options, render

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[3]
PRE_SPLIT = "fb9fd32"
"""A commit whose `src/athanor/moves/templates/fast.py` is the template as one file, before it became pieces."""
PRE_SPLIT_OPTIONS = ("fused_qkv", "fused_gate_up", "rmsnorm", "rope", "attention", "sdpa", "kv_layout", "gemv",
                     "silu_mul", "moe", "routing", "compile", "graphs", "linear_dtype", "merge_early", "early_keys",
                     "split_early", "lm_head", "embedding", "evict_weights")
"""The options the one-file template had (a later move is new code, with nothing to compare it to)."""
_serial = itertools.count()


def load_candidate(source: str, tmp_path: Path):
    path = tmp_path / f"candidate_pieces_{next(_serial)}.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[path.stem] = module
    spec.loader.exec_module(module)
    return module


def run(build, model, seed: int, rows: int = 3) -> tuple[list[torch.Tensor], list[tuple[int, torch.Tensor]]]:
    """Every output of a prefill (continued, for 3 rows) and two decode steps (through `decode_greedy` too where
    the forward has one), and the routing its observer saw."""
    gen = torch.Generator().manual_seed(seed)
    fwd = build(model, BuildContext(torch.device("cpu"), model.dtype, max_seqs=4, max_seq_len=64))
    routes: list[tuple[int, torch.Tensor]] = []
    fwd.routing_observer = lambda i, ids: routes.append((i, ids.clone()))
    vocab = model.spec.vocab_size
    if rows == 3:
        prompts = [torch.randint(0, vocab, (n,), generator=gen).tolist() for n in (5, 11, 2)]
        outs = [fwd.prefill(make_prefill_batch(prompts, [0, 2, 3]))]
        more = torch.randint(0, vocab, (4,), generator=gen).tolist()
        outs.append(fwd.prefill(make_prefill_batch([more], [2], seq_lens=[11])))
        positions, slots = torch.tensor([5, 15, 2]), torch.tensor([0, 2, 3])
    else:
        outs = [fwd.prefill(make_prefill_batch([torch.randint(0, vocab, (6,), generator=gen).tolist()], [1]))]
        positions, slots = torch.tensor([6]), torch.tensor([1])
    for _ in range(2):
        batch = DecodeBatch(torch.randint(0, vocab, (rows,), generator=gen), positions.clone(), slots,
                            positions.clone())
        if hasattr(fwd, "decode_greedy"):
            outs += fwd.decode_greedy(batch)
        outs.append(fwd.decode(batch))
        positions += 1
    return outs, routes


def assert_same(source: str, expected_source: str, preset: str | ModelSpec, tmp_path: Path, fused_rows: int = 1,
                rows: int = 3, seed: int = 0) -> None:
    """Both sources' outputs, with FUSED_ROWS set to `fused_rows`, equal up to fp32 rounding (module docstring) on a
    2-layer model in fp32, and their routing identical."""
    spec = PRESETS[preset] if isinstance(preset, str) else preset
    model = random_model(spec.with_layers(2), seed=seed)
    results = []
    for text in (source, expected_source):
        assert "FUSED_ROWS = 1\n" in text
        candidate = load_candidate(text.replace("FUSED_ROWS = 1\n", f"FUSED_ROWS = {fused_rows}\n"), tmp_path)
        with torch.no_grad():
            results.append(run(candidate.build, model, seed + 1, rows))
    (got, got_routes), (expected, expected_routes) = results
    assert len(got) == len(expected) and len(got_routes) == len(expected_routes)
    for step, (a, b) in enumerate(zip(got, expected)):
        if a.is_floating_point():
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5 * float(b.abs().max()),
                                       msg=lambda m, step=step: f"output {step}: {m}")
        else:  # greedy tokens
            assert torch.equal(a, b), f"output {step} differs"
    for (i, a), (j, b) in zip(got_routes, expected_routes):
        assert i == j and torch.equal(a, b)


@pytest.fixture(scope="module")
def pre_split() -> str:
    """The template as it was one file, read from git history."""
    try:
        return subprocess.run(["git", "show", f"{PRE_SPLIT}:src/athanor/moves/templates/fast.py"], cwd=REPO,
                              capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError) as e:
        pytest.skip(f"the one-file template is read from git history, which this checkout lacks "
                    f"(`git show {PRE_SPLIT}:...` failed: {e})")


_MOE = PRESETS["tiny-moe"].moe
assert _MOE is not None
ROUTED_ONLY = dataclasses.replace(PRESETS["tiny-moe"], name="tiny-moe-routed",
                                  moe=dataclasses.replace(_MOE, shared_intermediate_size=0, shared_gate=False))
"""tiny-moe without its shared expert: the fused layer's own MoE path."""

def _known(options: dict[str, Any]) -> dict[str, Any]:
    return {name: value for name, value in options.items() if name in PRE_SPLIT_OPTIONS}


TORCH_PATHS = [
    ("baseline", {}, "tiny-moe"),
    ("torch-fusions", {"fused_qkv": True, "fused_gate_up": True, "kv_layout": "token_major", "sdpa": "math",
                       "graphs": False, "moe": "grouped_mm"}, "tiny-moe"),
    ("best-cpu-lossy", _known(best_options(PRESETS["tiny-qwen"], "cpu", lossy=True)), "tiny-qwen"),
]
"""Option sets whose kernels all run in PyTorch (no Triton interpreter): seconds each."""


@pytest.mark.parametrize(("options", "preset"), [c[1:] for c in TORCH_PATHS], ids=[c[0] for c in TORCH_PATHS])
def test_torch_paths_compute_what_the_one_file_template_did(options, preset, pre_split, tmp_path):
    assert_same(render("fast", options), render(pre_split, options), preset, tmp_path)


def _catalog_cases() -> list[tuple[str, dict, str | ModelSpec, int, int]]:
    """(id, options, preset, FUSED_ROWS, decode rows): every option's every value, the best-known candidates, and
    the fused layer's paths (3 rows with FUSED_ROWS 3; one row for the gather inside the first QKV kernel). A
    forward with `decode_greedy` is run through it and `decode` both: the LM head with and without the argmax."""
    cases: list[tuple[str, dict, str | ModelSpec, int, int]] = []
    for m in (m for m in MOVES if m.name in PRE_SPLIT_OPTIONS):
        for v in m.values:
            if m.name != "compile" or v is None:  # compiling is tested against the reference, not here (minutes)
                preset = "tiny-moe" if m.applies_to == "moe" or m.name == "fused_gate_up" else "tiny-qwen"
                cases.append((f"{m.name}={v}", {m.name: v}, preset, 1, 3))
    for preset in ("tiny-dense", "tiny-qwen", "tiny-moe", ROUTED_ONLY):
        name = preset if isinstance(preset, str) else preset.name
        spec = PRESETS[preset] if isinstance(preset, str) else preset
        for device in ("cuda", "cpu"):
            cases.append((f"best-{device}-{name}", _known(best_options(spec, device)), preset, 3, 3))
        cases.append((f"best-one-row-{name}", _known({**best_options(spec), "embedding": "triton_qkv_prologue"}),
                      preset, 1, 1))
    fused = {"gemv": "triton_fused", "fused_qkv": True, "rope": "triton_qkv_epilogue"}
    for routing in ("triton", "triton_router_epilogue", "triton_expert_prologue", "triton_moe_block"):  # and best's
        cases.append((f"fused-routing={routing}", _known({**best_options(ROUTED_ONLY), **fused, "routing": routing}),
                      ROUTED_ONLY, 3, 3))
    dense = _known(best_options(PRESETS["tiny-dense"]))
    cases.append(("fused-separate-weights", {**dense, "gemv": "triton_fused", "fused_qkv": False,
                                             "fused_gate_up": False}, "tiny-dense", 3, 3))
    return cases


CATALOG = _catalog_cases()


@pytest.mark.parametrize(("options", "preset", "fused_rows", "rows"), [c[1:] for c in CATALOG],
                         ids=[c[0] for c in CATALOG])
def test_every_option_set_computes_what_the_one_file_template_did(options, preset, fused_rows, rows, pre_split,
                                                                  tmp_path):
    assert_same(render("fast", options), render(pre_split, options), preset, tmp_path, fused_rows, rows)
