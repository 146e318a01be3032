"""`athanor bench collectives` over gloo ranks on this machine, the link it fits, and the plan that takes it."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from athanor.bench.collectives import bus_factor, fit_link
from athanor.cli import main
from athanor.model import Layout
from athanor.model.registry import load_spec
from athanor.plan import make_plan, render
from athanor.plan.calibration import calibrate, read_records
from athanor.plan.hardware import KNOWN
from athanor.traffic import load_profile


def test_the_fit_recovers_a_planted_link() -> None:
    bandwidth, latency, ranks = 40e9, 7e-6, 4
    cells = [{"op": "all_reduce", "bytes": b, "ranks": ranks, "median_s": b / bandwidth + (ranks - 1) * latency}
             for b in (4096, 1 << 20, 64 << 20)]
    cells.append({"op": "all_gather", "bytes": 1 << 20, "ranks": ranks, "median_s": 1.0})  # not an all-reduce
    link = fit_link(cells)
    assert link["link_bytes_s"] == pytest.approx(bandwidth, rel=1e-6)
    assert link["link_latency_s"] == pytest.approx(latency, rel=1e-6)
    assert bus_factor("all_gather", 4) == 0.75 and bus_factor("all_reduce", 4) == 1.0


def test_two_gloo_ranks_measure_each_collective_and_write_a_record(tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "coll.json"
    assert main(["bench", "collectives", "--device", "cpu", "--sizes", "4096,262144", "--iters", "3",
                 "--json", str(out)]) == 0
    record = json.loads(out.read_text())
    ops = {(c["op"], c["bytes"]) for c in record["cells"]}
    assert {("all_reduce", 4096), ("all_reduce", 262144), ("all_gather", 262144)} <= ops
    assert all(c["median_s"] > 0 and c["ranks"] == 2 for c in record["cells"])
    assert record["link"]["link_bytes_s"] > 0 and record["device"] == "cpu" and record["git_commit"] is not None
    assert capsys.readouterr().out.strip().splitlines()[-1].endswith(f"-> {out}")


def test_the_plan_prices_layouts_on_the_measured_link(tmp_path: Path) -> None:
    """A record of a slow link (a CPU's loopback, say) turns the plan from TP to replicas, and says so."""
    spec, h200 = load_spec("llama-3.1-8b"), KNOWN["h200"]
    record = tmp_path / "coll.json"
    record.write_text(json.dumps({"benchmark": "collectives", "ranks": 2, "device_name": "loopback", "cells": [],
                                  "link": {"link_bytes_s": 1e8, "link_latency_s": 5e-3}}))
    cal = calibrate(spec, h200, read_records(spec, [str(record)]))
    assert cal.cells == 0 and cal.link_bytes_s == 1e8
    free = dataclasses.replace(h200, link_bytes_s=1e18, link_latency_s=0.0)
    assert make_plan(spec, free, 4, load_profile("preset:chat"), (1,)).best(1, "tpot_s").layout.tp == 4
    measured = make_plan(spec, free, 4, load_profile("preset:chat"), (1,), cal)
    assert measured.best(1, "tpot_s").layout == Layout(dp=4)
    assert "link: 0.1 GB/s, 5000.0 us per rank, measured by" in render(measured)
