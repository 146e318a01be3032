"""`athanor plan`: the layouts a model allows, and rankings on synthetic hardware whose best layout is known by
construction (a link so slow that only replicas pay off, a GPU too small for one copy, a free link that makes the
widest TP the fastest), calibration against a record, and the command's output and errors."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest

from athanor.errors import ConfigError
from athanor.model import Layout
from athanor.model.registry import load_spec
from athanor.plan import DEFAULT_CONCURRENCY, calibrate, make_plan
from athanor.plan.cost import decode_step, layouts
from athanor.plan.hardware import KNOWN, load_hardware
from athanor.traffic import load_profile

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


def test_calibration_scales_the_decode_term_to_the_record(tmp_path: Path) -> None:
    spec = load_spec("llama-3.1-8b")
    cells = [{"model": spec.name, "candidate": "best", "status": "ok", "batch": b, "context": c,
              "ms_per_token": 1.5 * 1000 * decode_step(spec, H200, Layout(), b, c).total_s}
             for b, c in ((1, 1024), (32, 1024), (8, 8192))]
    cells.append({**cells[0], "candidate": "reference", "ms_per_token": 99.0})  # not the best candidate: ignored
    record = tmp_path / "decode.json"
    record.write_text(json.dumps({"cells": cells}))
    cal = calibrate(spec, H200, [str(record)])
    assert cal.cells == 3 and cal.factor == pytest.approx(1.5, rel=0.02)
    plain, fitted = (make_plan(spec, H200, 1, CHAT, (32,), c) for c in (None, cal))
    assert fitted.levels[32][0].tpot_s > 1.3 * plain.levels[32][0].tpot_s
    with pytest.raises(ConfigError, match="no decode cell of llama-3.2-1b"):
        calibrate(load_spec("llama-3.2-1b"), H200, [str(record)])


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
