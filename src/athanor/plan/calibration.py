"""The plan's decode term fitted to measured steps, and the fit scored on steps it was not fitted on.

`athanor bench decode` records give a model's measured step at each (batch, context) cell on one GPU. The fit
(`DecodeFit`) weighs the modelled terms of a TP1 step (weight bytes, KV bytes, FLOPs over the GPU's rates, a fixed
cost) by non-negative least squares on the cells chosen to fit on; `check` then sets the specification's prediction
and the fitted one beside every measured cell, and the plan's memory verdict beside the cells the benchmark found
too large. A fit is per model and per GPU: it learns what that model's kernels reach on that machine.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Collection
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from scipy.optimize import nnls

from athanor.errors import ConfigError
from athanor.model import Layout, ModelSpec
from athanor.plan.cost import DecodeFit, decode_step, held_bytes
from athanor.plan.hardware import Hardware

if TYPE_CHECKING:
    from athanor.traffic.routing import RoutingProfile


@dataclass(frozen=True)
class Cell:
    """One measured decode cell of a model: its step in seconds, or None where the benchmark found that the KV
    cache would not fit beside the weights."""

    batch: int
    context: int
    measured_s: float | None


@dataclass(frozen=True)
class Calibration:
    """What measurement replaces in the plan: the decode term's fit and the link."""

    fit: DecodeFit | None = None
    cells: int = 0
    """Cells the fit was made on."""
    source: str = ""
    link_bytes_s: float = 0.0
    """The link an `athanor bench collectives` record measured (0: the hardware description's)."""
    link_latency_s: float = 0.0
    link_source: str = ""

    def hardware(self, hw: Hardware) -> Hardware:
        """`hw` with the measured link in place of its described one, where a record measured it."""
        if not self.link_bytes_s:
            return hw
        return replace(hw, link_bytes_s=self.link_bytes_s, link_latency_s=self.link_latency_s)


@dataclass(frozen=True)
class Records:
    """What `athanor bench` records hold for one model: its decode cells, and a measured link."""

    source: str
    """The records' paths, comma-separated."""
    cells: list[Cell]
    link: dict[str, float]
    link_source: str


def read_records(spec: ModelSpec, paths: list[str]) -> Records:
    """The best candidate's decode cells of `spec` in these `athanor bench decode` records (the last measurement of a
    cell wins), and the link of the last `athanor bench collectives` record among them."""
    cells: dict[tuple[int, int], Cell] = {}
    link: dict[str, float] = {}
    link_source = ""
    for path in paths:
        try:
            record = json.loads(Path(path).read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise ConfigError(f"--calibrate {path}: not a readable bench record ({e})") from None
        if not isinstance(record, dict):
            raise ConfigError(f"--calibrate {path}: not an athanor bench decode or collectives record")
        if record.get("benchmark") == "collectives":
            link, link_source = record["link"], f"{path} ({record['ranks']} ranks on {record.get('device_name')})"
            continue
        for c in record.get("cells") or ():
            if c.get("model") != spec.name or c.get("candidate") != "best" or c.get("status") not in ("ok",
                                                                                                      "does_not_fit"):
                continue
            measured = float(c["ms_per_token"]) / 1000 if c["status"] == "ok" else None
            cells[(int(c["batch"]), int(c["context"]))] = Cell(int(c["batch"]), int(c["context"]), measured)
    return Records(", ".join(paths), sorted(cells.values(), key=lambda c: (c.batch, c.context)), link, link_source)


def _terms(spec: ModelSpec, hw: Hardware, cell: Cell, routing: RoutingProfile | None) -> tuple[float, float, float]:
    step = decode_step(spec, hw, Layout(), cell.batch, cell.context, routing=routing)
    return step.weight_s, step.kv_s, step.compute_s


def fit_decode(spec: ModelSpec, hw: Hardware, cells: list[Cell], routing: RoutingProfile | None = None) -> DecodeFit:
    """Non-negative least squares of the measured steps on the modelled terms, relative to each step (every cell
    weighs alike, short steps as much as long ones). With cells of only one row, or none of one row, both weight
    coefficients are the one the cells show."""
    measured = [c for c in cells if c.measured_s is not None]
    if not measured:
        raise ConfigError(f"--calibrate: no measured decode cell of {spec.name} to fit on")
    single = [c.batch == 1 for c in measured]
    split = any(single) and not all(single)
    rows = []
    for c, one in zip(measured, single, strict=True):
        w, kv, f = _terms(spec, hw, c, routing)
        rows.append(([w * one, w * (not one)] if split else [w]) + [kv, f, 1.0])
    y = np.array([c.measured_s for c in measured], dtype=float)
    x = np.array(rows, dtype=float) / y[:, None]
    coef, _ = nnls(x, np.ones(len(y)))
    gemv, gemm = (coef[0], coef[1]) if split else (coef[0], coef[0])
    kv, compute, overhead = coef[-3:]
    return DecodeFit(float(gemv), float(gemm), float(kv), float(compute), float(overhead))


def calibrate(spec: ModelSpec, hw: Hardware, read: Records, routing: RoutingProfile | None = None,
              fit_batches: Collection[int] = (), fit_contexts: Collection[int] = ()) -> Calibration:
    """The decode fit on the records' cells of this model (only those of `fit_batches` x `fit_contexts` where given)
    and the link an `athanor bench collectives` record fitted."""
    cells = [c for c in read.cells if _chosen(c, fit_batches, fit_contexts)]
    if not any(c.measured_s is not None for c in cells) and not read.link:
        raise ConfigError(f"--calibrate: no decode cell of {spec.name} (candidate best) to fit on and no collectives "
                          f"record in {read.source}")
    fit = fit_decode(spec, hw, cells, routing) if any(c.measured_s is not None for c in cells) else None
    return Calibration(fit, sum(c.measured_s is not None for c in cells), read.source,
                       read.link.get("link_bytes_s", 0.0), read.link.get("link_latency_s", 0.0), read.link_source)


def _chosen(cell: Cell, batches: Collection[int], contexts: Collection[int]) -> bool:
    return (not batches or cell.batch in batches) and (not contexts or cell.context in contexts)


@dataclass(frozen=True)
class CheckRow:
    batch: int
    context: int
    fitted_on: bool
    measured_s: float | None
    spec_s: float
    fitted_s: float
    plan_fits: bool
    """Whether the plan holds the weights and this cell's KV on one GPU (the measured cell: `measured_s` set)."""

    def error(self, predicted_s: float) -> float:
        assert self.measured_s is not None
        return predicted_s / self.measured_s - 1.0


@dataclass(frozen=True)
class Check:
    model: str
    rows: list[CheckRow]

    def scored(self) -> list[CheckRow]:
        return [r for r in self.rows if r.measured_s is not None and not r.fitted_on]

    def summary(self) -> dict[str, Any]:
        """Median and 90th percentile of the absolute relative error over the cells not fitted on, of the
        specification's prediction and of the fitted one; and how often the plan's memory verdict was right."""
        scored = self.scored()
        out: dict[str, Any] = {"model": self.model, "scored_cells": len(scored)}
        for name in ("spec_s", "fitted_s"):
            errors = sorted(abs(r.error(getattr(r, name))) for r in scored)
            out[name.replace("_s", "")] = ({"median": statistics.median(errors),
                                            "p90": float(np.percentile(errors, 90))} if errors else None)
        out["fit_verdicts_right"] = sum(r.plan_fits == (r.measured_s is not None) for r in self.rows)
        out["cells"] = len(self.rows)
        return out


def check(spec: ModelSpec, hw: Hardware, read: Records, calibration: Calibration,
          routing: RoutingProfile | None = None, fit_batches: Collection[int] = (),
          fit_contexts: Collection[int] = ()) -> Check:
    """Every cell of the records beside the specification's prediction and the calibrated one."""
    rows = []
    for c in read.cells:
        spec_s = decode_step(spec, hw, Layout(), c.batch, c.context, routing=routing).total_s
        fitted_s = decode_step(spec, hw, Layout(), c.batch, c.context, calibration.fit, routing).total_s
        fits = held_bytes(spec, Layout(), c.batch * c.context) <= hw.usable_bytes()
        rows.append(CheckRow(c.batch, c.context, _chosen(c, fit_batches, fit_contexts), c.measured_s, spec_s,
                             fitted_s, fits))
    return Check(spec.name, rows)


def render_check(result: Check) -> str:
    lines = [f"{result.model}: measured decode steps against the plan's prediction (TP1)",
             f"  {'batch':>6}{'context':>9}{'measured ms':>13}{'spec ms':>10}{'err':>7}{'fitted ms':>11}{'err':>7}"
             f"  {'fits':<5}"]
    for r in result.rows:
        measured = f"{1000 * r.measured_s:.3f}" if r.measured_s is not None else "no fit"
        spec_err = f"{100 * r.error(r.spec_s):+.0f}%" if r.measured_s is not None else ""
        fit_err = f"{100 * r.error(r.fitted_s):+.1f}%" if r.measured_s is not None else ""
        lines.append(f"  {r.batch:>6}{r.context:>9}{measured:>13}{1000 * r.spec_s:>10.3f}{spec_err:>7}"
                     f"{1000 * r.fitted_s:>11.3f}{fit_err:>7}  {'yes' if r.plan_fits else 'NO':<5}"
                     f"{'  (fitted on)' if r.fitted_on else ''}")
    s = result.summary()
    for name in ("spec", "fitted"):
        if s[name]:
            lines.append(f"  {name}: median error {100 * s[name]['median']:.1f}%, p90 {100 * s[name]['p90']:.1f}% "
                         f"over the {s['scored_cells']} cells not fitted on")
    lines.append(f"  memory: the plan's verdict matches the benchmark's in {s['fit_verdicts_right']} of {s['cells']} "
                 "cells")
    return "\n".join(lines)
