"""Drift: has the traffic changed, by how much, and does it warrant recompiling?

Two levels, as production ML monitoring separates them:

- a feature has **moved** when a two-sample test rejects "same distribution" (KS, SciPy's
  `ks_2samp`, Bonferroni-corrected over the features) *and* the effect is at least moderate
  (PSI >= 0.1, the usual "moderate change" line, or a Wasserstein shift of 10% of the mean). With
  thousands of requests every p-value is tiny, so the p-value alone never decides; with few requests
  the test guards against noise.
- a **recompile** is warranted only by a change the engine feels: where the prefill tokens
  fall by length (token-weighted PSI over power-of-two shape buckets >= 0.25), where decode
  tokens fall by context length (same), or the implied decode batch size (Little's law:
  rate x output length x per-token latency) changing by 2x or more. A streaming monitor asks
  for the change to persist over `persistence` consecutive windows first: a recompile costs
  minutes of compiling, which a one-window blip does not repay.

Thresholds were checked on the shared Azure 2023 (Splitwise) and Mooncake traces: random halves
are never flagged, 10-minute windows of one service warrant at most one recompile, a 1.3x shift
of prompt lengths is flagged at once (tests/unit/traffic/test_drift.py).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
from scipy import stats

from athanor.traffic.chunk import RequestChunk
from athanor.traffic.profile import DEFAULT_TPOT_S, TrafficProfile, profile_chunks

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class DriftThresholds:
    """Where a change counts. Each default follows common production-monitoring practice."""

    alpha: float = 0.05
    """Family-wise significance level of the KS tests (Bonferroni over the sampled features)."""
    psi_moved: float = 0.1
    """PSI at which a distribution has moved (0.1-0.2 is 'moderate' in credit-risk monitoring)."""
    w1_moved: float = 0.1
    """Wasserstein-1 distance, relative to the reference mean, at which a length distribution has
    moved (catches shifts PSI's decile bins miss when many requests tie, e.g. at a length cap)."""
    psi_recompile: float = 0.25
    """Token-weighted PSI over the engine's power-of-two shape buckets that warrants a recompile."""
    batch_ratio_recompile: float = 2.0
    """Factor by which the implied mean decode batch must change to warrant a recompile."""
    min_requests: int = 100
    """Below this many requests on either side nothing is judged (too little to tell)."""


@dataclass(frozen=True)
class FeatureDrift:
    """One feature's change from the reference to the current traffic."""

    name: str
    reference: float
    """The reference's summary value (mean, or mean batch size)."""
    current: float
    ks_statistic: float | None
    p_value: float | None
    wasserstein: float | None
    """Wasserstein-1 distance relative to the reference mean (scale free)."""
    psi: float | None
    moved: bool
    warrants_recompile: bool


@dataclass(frozen=True)
class DriftReport:
    reference: str
    current: str
    features: tuple[FeatureDrift, ...]
    drifted: bool
    """Some feature moved significantly (the CLI's exit status 1)."""
    recompile: bool
    """Some change warrants recompiling."""
    note: str = ""

    def moved(self) -> list[str]:
        return [f.name for f in self.features if f.moved]

    def to_dict(self) -> dict[str, Any]:
        from dataclasses import asdict

        return asdict(self)

    def summary(self) -> str:
        head = "DRIFT" if self.drifted else "no significant drift"
        if self.recompile:
            head += " (warrants a recompile)"
        lines = [f"{head}: {self.reference} -> {self.current}" + (f" ({self.note})" if self.note else "")]
        for f in self.features:
            mark = "RECOMPILE" if f.warrants_recompile else ("moved" if f.moved else "-")
            extra = []
            if f.p_value is not None:
                extra.append(f"KS {f.ks_statistic:.3f} p={f.p_value:.2g}")
            if f.wasserstein is not None:
                extra.append(f"W1 {f.wasserstein:.1%}")
            if f.psi is not None:
                extra.append(f"PSI {f.psi:.3f}")
            lines.append(f"  {f.name:<16} {f.reference:>10,.1f} -> {f.current:>10,.1f}  {', '.join(extra):<44} {mark}")
        return "\n".join(lines)


def psi(ref: np.ndarray, cur: np.ndarray, eps: float = 1e-4) -> float:
    """Population stability index of two histograms over the same bins."""
    p = np.maximum(ref / max(ref.sum(), 1e-12), eps)
    q = np.maximum(cur / max(cur.sum(), 1e-12), eps)
    return float(np.sum((q - p) * np.log(q / p)))


def decile_psi(ref: np.ndarray, cur: np.ndarray) -> float:
    """PSI over the reference's deciles (ties merge bins), the usual binning."""
    edges = np.unique(np.quantile(ref, np.linspace(0, 1, 11)))
    edges = np.concatenate([[-np.inf], edges[1:-1], [np.inf]])
    return psi(np.histogram(ref, edges)[0].astype(float), np.histogram(cur, edges)[0].astype(float))


def _sampled(name: str, ref: np.ndarray, cur: np.ndarray, alpha: float, th: DriftThresholds) -> FeatureDrift:
    ks = stats.ks_2samp(ref, cur)
    w1 = stats.wasserstein_distance(ref, cur) / max(float(ref.mean()), 1e-12)
    p = decile_psi(ref, cur)
    moved = bool(ks.pvalue < alpha and (p >= th.psi_moved or w1 >= th.w1_moved))
    return FeatureDrift(name, float(ref.mean()), float(cur.mean()), float(ks.statistic), float(ks.pvalue),
                        float(w1), p, moved, False)


def _shape(name: str, ref_hist: tuple[float, ...] | tuple[int, ...], cur_hist: tuple[float, ...] | tuple[int, ...],
           ref_mean: float, cur_mean: float, significant: bool, th: DriftThresholds) -> FeatureDrift:
    p = psi(np.asarray(ref_hist, dtype=float), np.asarray(cur_hist, dtype=float))
    hit = bool(significant and p >= th.psi_recompile)
    return FeatureDrift(name, ref_mean, cur_mean, None, None, None, p, hit, hit)


def compare_profiles(ref: TrafficProfile, cur: TrafficProfile, th: DriftThresholds | None = None) -> DriftReport:
    """Compare two profiles feature by feature (see the module docstring for the rules)."""
    th = th or DriftThresholds()
    if min(ref.num_requests, cur.num_requests) < th.min_requests:
        return DriftReport(ref.source, cur.source, (), False, False,
                           f"fewer than {th.min_requests} requests on one side: not judged")
    alpha = th.alpha / 2  # two sampled features
    f_in = _sampled("input_length", np.asarray(ref.sample.input_length, float),
                    np.asarray(cur.sample.input_length, float), alpha, th)
    f_out = _sampled("output_length", np.asarray(ref.sample.output_length, float),
                     np.asarray(cur.sample.output_length, float), alpha, th)
    sig_in = f_in.p_value is not None and f_in.p_value < alpha
    sig_out = f_out.p_value is not None and f_out.p_value < alpha
    ctx_ref = _mean_bucket(ref.decode.context_hist)
    ctx_cur = _mean_bucket(cur.decode.context_hist)
    f_prefill = _shape("prefill_tokens", ref.input.token_hist, cur.input.token_hist, ref.input.mean,
                       cur.input.mean, sig_in, th)
    f_ctx = _shape("decode_context", ref.decode.context_hist, cur.decode.context_hist, ctx_ref, ctx_cur,
                   sig_in or sig_out, th)
    b_ref, b_cur = ref.decode.mean_batch, cur.decode.mean_batch
    ratio = max(b_ref, b_cur) / max(min(b_ref, b_cur), 1e-9)
    batch_hit = ratio >= th.batch_ratio_recompile
    f_batch = FeatureDrift("decode_batch", b_ref, b_cur, None, None, None, None,
                           bool(ratio >= np.sqrt(th.batch_ratio_recompile)), bool(batch_hit))
    feats = (f_in, f_out, f_prefill, f_ctx, f_batch)
    return DriftReport(ref.source, cur.source, feats, any(f.moved for f in feats),
                       any(f.warrants_recompile for f in feats))


def _mean_bucket(hist: tuple[float, ...]) -> float:
    """Token-weighted geometric bucket centre: a readable 'typical context length'."""
    h = np.asarray(hist, dtype=float)
    if h.sum() <= 0:
        return 0.0
    centres = 2.0 ** (np.arange(len(h)) + 0.5)
    return float((h * centres).sum() / h.sum())


@dataclass
class DriftMonitor:
    """Streaming drift over consecutive windows: compare each with the reference; a recompile
    makes the window it was warranted by the new reference (what the loop deploys for)."""

    reference: TrafficProfile | None = None
    thresholds: DriftThresholds = field(default_factory=DriftThresholds)
    reset_on_recompile: bool = True
    persistence: int = 2
    """Consecutive windows a recompile-worthy change must last before a recompile is warranted."""
    num_recompiles: int = 0
    streak: int = 0
    """Consecutive windows so far with a recompile-worthy change (a caller that restarts restores it)."""

    def observe(self, window: TrafficProfile) -> DriftReport | None:
        """Judge one window; the first window seen becomes the reference (returns None)."""
        if self.reference is None:
            self.reference = window
            return None
        report = compare_profiles(self.reference, window, self.thresholds)
        self.streak = self.streak + 1 if report.recompile else 0
        if self.streak < self.persistence:
            if report.recompile:
                report = replace(report, recompile=False,
                                 note=f"recompile-worthy change in {self.streak} of {self.persistence} windows")
            return report
        self.streak = 0
        self.num_recompiles += 1
        log.info("drift warrants a recompile: %s", ", ".join(report.moved()))
        if self.reset_on_recompile:
            self.reference = window
        return report


def follow(path: str | Path, window_s: float, poll_s: float = 1.0, tpot_s: float = DEFAULT_TPOT_S,
           monitor: DriftMonitor | None = None, stop_after: float | None = None) -> Iterator[DriftReport]:
    """Follow a growing JSONL request log (athanor or Mooncake format) and yield a report per
    completed window. `stop_after` (seconds of wall time) ends the loop, for tests and scripts."""
    from athanor.traffic.formats import athanor_row, mooncake_row

    monitor = monitor or DriftMonitor()
    path = Path(path)
    offset, buf = 0, ""
    rows: list[tuple[float, int, int]] = []
    window_start: float | None = None
    began = time.monotonic()
    while stop_after is None or time.monotonic() - began < stop_after:
        with open(path, encoding="utf-8") as f:
            f.seek(offset)
            data = f.read()
            offset = f.tell()
        buf += data
        *lines, buf = buf.split("\n")  # an unfinished last line waits for the writer
        for line in lines:
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
                t, n_in, n_out, *_ = (athanor_row if "ttft_s" in rec else mooncake_row)(rec)
            except (json.JSONDecodeError, KeyError, TypeError, ValueError) as e:
                log.warning("%s: skipped a malformed line: %s", path, e)
                continue
            if window_start is None:
                window_start = t
            while t >= window_start + window_s:
                report = _close(rows, window_start, window_s, tpot_s, monitor, str(path))
                rows, window_start = [], window_start + window_s
                if report is not None:
                    yield report
            rows.append((t, n_in, n_out))
        if not data:
            time.sleep(poll_s)


def _close(rows: list[tuple[float, int, int]], start: float, window_s: float, tpot_s: float,
           monitor: DriftMonitor, source: str) -> DriftReport | None:
    if not rows:
        return None
    a = np.asarray(rows)
    chunk = RequestChunk(a[:, 0], a[:, 1].astype(np.int64), a[:, 2].astype(np.int64))
    prof = profile_chunks([chunk], f"{source}@{start:.0f}", tpot_s=tpot_s)
    return monitor.observe(prof)
