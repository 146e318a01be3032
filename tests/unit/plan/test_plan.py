"""`athanor plan`: the layouts a model allows, and rankings on synthetic hardware whose best layout is known by
construction (a link so slow that only replicas pay off, a GPU too small for one copy, a free link that makes the
widest TP the fastest), calibration against a record, and the command's output and errors."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from athanor.errors import ConfigError
from athanor.model import Layout
from athanor.model.registry import load_spec
from athanor.plan import DEFAULT_CONCURRENCY, make_plan
from athanor.plan.calibration import calibrate, check, read_records
from athanor.plan.cost import DecodeFit, decode_step, layouts, touched_experts
from athanor.plan.hardware import KNOWN, load_hardware
from athanor.traffic import load_profile
from athanor.traffic.routing import parametric_routing

H200 = KNOWN["h200"]
CHAT = load_profile("preset:chat")


def test_layouts_follow_the_models_shapes() -> None:
    dense = {layout.name for layout in layouts(load_spec("llama-3.1-8b"), 8)}  # 32 heads, 8 KV heads, 32 layers
    assert {"tp8", "dp8", "tp2.dp4", "tp4.pp2", "pp8"} <= dense
    assert all(layout.gpus == 8 for layout in layouts(load_spec("llama-3.1-8b"), 8))
    moe = {layout.name for layout in layouts(load_spec("qwen3-30b-a3b"), 4)}  # 128 experts, 4 KV heads
    assert "tp2.ep4.dp2" in moe and "tp4" in moe and "ep4.dp4" in moe
    assert not any("dcp" in name for name in moe)  # 4 KV heads over TP 4: nothing replicated to split
    wide = {layout.name for layout in layouts(load_spec("qwen3-30b-a3b"), 8)}
    assert "tp8.dcp2" in wide  # TP 8 over 4 KV heads holds each twice: DCP splits those copies' tokens


def test_a_link_too_slow_for_collectives_leaves_replicas_the_best() -> None:
    slow = dataclasses.replace(H200, link_bytes_s=1e8, link_latency_s=5e-3)
    plan = make_plan(load_spec("llama-3.1-8b"), slow, 4, CHAT, (64,))
    assert plan.best(64).layout == Layout(dp=4)


def test_a_gpu_too_small_for_one_copy_needs_the_model_split() -> None:
    small = dataclasses.replace(H200, memory_gib=6.0)  # 8B in bf16 is 15 GiB: only a four-way split holds it
    plan = make_plan(load_spec("llama-3.1-8b"), small, 4, CHAT, (1,))
    fits = {e.layout.name for e in plan.levels[1] if e.fits}
    assert fits and all(e.layout.tp * e.layout.pp == 4 for e in plan.levels[1] if e.fits), fits
    assert not next(e for e in plan.levels[1] if e.layout.name == "dp4").fits


def test_a_free_link_makes_the_widest_tp_the_fastest_at_batch_one() -> None:
    free = dataclasses.replace(H200, link_bytes_s=1e18, link_latency_s=0.0, step_overhead_s=0.0)
    plan = make_plan(load_spec("llama-3.1-8b"), free, 8, CHAT, (1,))
    fastest = plan.best(1, "tpot_s")
    assert fastest is not None and fastest.layout == Layout(tp=8)
    one = decode_step(load_spec("llama-3.1-8b"), free, Layout(), 1, 1024).total_s
    assert fastest.tpot_s == pytest.approx(one / 8, rel=0.1)  # memory-bound: an eighth of the bytes per GPU


def _record(tmp_path: Path, spec_name: str, step_ms: Callable[[int, int], float | None]) -> str:
    """A bench decode record of `spec_name`'s best candidate over batch 1-256 x context 1k-32k (None: does not
    fit), with a reference cell that must be ignored."""
    cells = []
    for b in (1, 8, 32, 64, 128, 256):
        for c in (1024, 8192, 32768):
            ms = step_ms(b, c)
            cells.append({"model": spec_name, "candidate": "best", "batch": b, "context": c,
                          **({"status": "ok", "ms_per_token": ms} if ms is not None else {"status": "does_not_fit"})})
    cells.append({**cells[0], "candidate": "reference", "ms_per_token": 99.0})
    path = tmp_path / f"decode_{spec_name}.json"
    path.write_text(json.dumps({"benchmark": "decode", "cells": cells}))
    return str(path)


def test_the_fit_recovers_known_coefficients_and_scores_cells_it_did_not_see(tmp_path: Path) -> None:
    spec = load_spec("llama-3.1-8b")
    truth = DecodeFit(gemv=1.15, gemm=1.3, kv=1.05, compute=0.4, overhead_s=60e-6)

    def step_ms(b: int, c: int) -> float | None:
        if b * c > 64 * 8192:  # the KV of these does not fit beside the weights
            return None
        return 1000 * decode_step(spec, H200, Layout(), b, c, truth).total_s

    record = _record(tmp_path, spec.name, step_ms)
    batches, contexts = (1, 8, 64), (1024, 8192)
    read = read_records(spec, [record])
    cal = calibrate(spec, H200, read, None, batches, contexts)
    assert cal.cells == 6 and cal.fit is not None
    # A dense model reads the same weights at every cell: only their time plus the fixed cost is identifiable.
    for name in ("kv", "compute"):
        assert getattr(cal.fit, name) == pytest.approx(getattr(truth, name), rel=0.02), name
    result = check(spec, H200, read, cal, None, batches, contexts)
    summary = result.summary()
    assert summary["scored_cells"] == len([r for r in result.rows if r.measured_s is not None]) - 6
    assert summary["fitted"]["p90"] < 0.01 < summary["spec"]["median"]  # the specification alone errs
    verdicts = {(r.batch, r.context): r.plan_fits for r in result.rows}
    assert verdicts[(1, 1024)] and not verdicts[(256, 32768)]
    plain, fitted = (make_plan(spec, H200, 1, CHAT, (32,), c) for c in (None, cal))
    assert fitted.levels[32][0].tpot_s > 1.1 * plain.levels[32][0].tpot_s
    with pytest.raises(ConfigError, match="no decode cell of llama-3.2-1b"):
        calibrate(load_spec("llama-3.2-1b"), H200, read_records(load_spec("llama-3.2-1b"), [record]))


def test_measured_routing_reads_fewer_experts_than_uniform() -> None:
    spec = load_spec("qwen3-30b-a3b")
    assert spec.moe is not None
    skewed = parametric_routing(spec.num_layers, spec.moe.num_experts, spec.moe.top_k, zipf=1.2, max_batch=64)
    for rows in (8, 64, 128, 256):
        fewer = touched_experts(spec, rows, skewed)
        assert fewer < touched_experts(spec, rows) <= spec.moe.num_experts, rows
    assert touched_experts(spec, 64, skewed) == skewed.distinct[63]
    assert touched_experts(spec, 64, skewed) < touched_experts(spec, 256, skewed)  # past the profile: still grows
    uniform, measured = (decode_step(spec, H200, Layout(), 32, 1024, routing=r).weight_s for r in (None, skewed))
    assert measured < uniform


def test_hardware_from_a_file_and_its_errors(tmp_path: Path) -> None:
    good = tmp_path / "gpu.json"
    good.write_text(json.dumps({"name": "test", "memory_gib": 10, "hbm_bytes_s": 1e12, "matmul_flops": 1e14,
                                "link_bytes_s": 1e11}))
    assert load_hardware(str(good)).memory_gib == 10 and load_hardware("H100") == KNOWN["h100"]
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"name": "x", "memory": 10}))
    with pytest.raises(ConfigError, match="unknown field"):
        load_hardware(str(bad))
    with pytest.raises(ConfigError, match="neither a known GPU"):
        load_hardware("b200x")


def test_the_command_ranks_every_level_and_writes_the_plan(tmp_path: Path) -> None:
    out = tmp_path / "plan.json"
    done = subprocess.run([sys.executable, "-m", "athanor", "plan", "--model", "qwen3-30b-a3b", "--gpus", "2",
                           "--gpu", "h100", "--json", str(out)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert all(f"concurrency {c}:" in done.stdout for c in DEFAULT_CONCURRENCY)
    plan = json.loads(out.read_text())
    assert set(plan["levels"]) == {str(c) for c in DEFAULT_CONCURRENCY}
    assert {row["layout"] for row in plan["levels"]["64"]} >= {"tp2", "dp2", "ep2.dp2", "pp2"}
    bad = subprocess.run([sys.executable, "-m", "athanor", "plan", "--model", "tiny-dense", "--gpus", "2",
                          "--concurrency", "8,x"], capture_output=True, text=True, timeout=60)
    assert bad.returncode != 0 and bad.stderr.strip().splitlines() == [
        "athanor: error: --concurrency 8,x: give whole numbers separated by commas"]
