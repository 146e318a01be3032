"""Comparing a candidate's trajectory with the reference's: tolerance per dtype, greedy agreement, quality.

The reference runs the same script in its own, trusted engine worker (no candidate code ever
runs there, so nothing can patch it or read its outputs); the comparison runs here, in the
evaluator's process, so a candidate cannot reach it either. Checked per run:

- no NaN or infinity (outputs are poisoned before each run, so a candidate that skips writing
  them shows NaN);
- kept logits within the dtype's tolerance (|c - r| <= atol + rtol |r|; a tail of at most
  `OUTLIER_SHARE` of them within `OUTLIER_SLACK` times it), or identical with `bitwise`;
- every row's fingerprint (projections on random unit directions, max, logsumexp) within the
  same tolerance, loosened by `FINGERPRINT_SLACK` for the sum over the vocabulary;
- greedy agreement: the argmax equals the reference's, except where the reference's top-2 margin
  is within the tolerance (a near tie that rounding may flip).

In quality mode (a lossy candidate with an explicit budget) the tolerance is replaced by the
mean KL divergence of next-token distributions and the change of perplexity on the text. Timed
runs keep fingerprints only: there the perplexity is checked, and the fingerprints may stray
from the reference's no further than `QUALITY_SLACK` times what the checked runs showed, so a
candidate cannot be lossy-but-close when checked and something else when timed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from athanor.engine.protocol import TrajectoryReply
from athanor.errors import ConfigError

TOLERANCES: dict[torch.dtype, tuple[float, float]] = {
    torch.float32: (1e-3, 1e-3),
    torch.float64: (1e-6, 1e-6),
    torch.float16: (2e-2, 1e-2),
    torch.bfloat16: (1e-1, 2e-2),
}
"""(atol, rtol) on logits per compute dtype; other dtypes (fp8, ...) use bf16's."""
FINGERPRINT_SLACK = 4.0
OUTLIER_SHARE = 1e-5
"""Share of the kept logits that may lie beyond the dtype's tolerance, though never beyond
`OUTLIER_SLACK` times it. A reordered low-precision accumulation (split-K, fused epilogues) leaves a
near-Gaussian error whose largest value grows with the number of values compared (a whole 8B model's
check compares ~1.5e7 logits), so correct kernels put a few values just past a bound on every value.
The tolerance bounds the bulk (a share of 1e-5 past it is a ~4.4 sigma tail); a wrong kernel moves
whole rows, far past twice it."""
OUTLIER_SLACK = 2.0
QUALITY_SLACK = 4.0


@dataclass(frozen=True)
class QualityBudget:
    """Admits a lossy candidate: mean KL(reference || candidate) and relative perplexity increase."""

    max_kl: float = 0.01
    max_ppl_increase: float = 0.02

    @classmethod
    def parse(cls, text: str) -> QualityBudget:
        """The budget `--quality-budget` names: `kl=NUMBER,ppl=NUMBER` (either may be left out for its
        default); ConfigError naming the flag otherwise."""
        values: dict[str, float] = {}
        for part in text.split(","):
            key, _, value = (s.strip() for s in part.partition("="))
            if key not in ("kl", "ppl"):
                raise ConfigError(f"--quality-budget {text}: unknown key {key!r}; use kl=NUMBER,ppl=NUMBER")
            try:
                values[key] = float(value)
            except ValueError:
                raise ConfigError(f"--quality-budget {text}: {part!r} is not KEY=NUMBER") from None
            if not 0 <= values[key] < math.inf:
                raise ConfigError(f"--quality-budget {text}: {key} must be a finite number >= 0")
        return cls(values.get("kl", cls.max_kl), values.get("ppl", cls.max_ppl_increase))

    def __str__(self) -> str:
        """The budget as `--quality-budget` takes it."""
        return f"kl={self.max_kl:g},ppl={self.max_ppl_increase:g}"


@dataclass(frozen=True)
class Comparison:
    ok: bool
    reason: str
    max_abs_err: float = float("nan")
    greedy_agreement: float = float("nan")
    kl: float = float("nan")
    ppl_change: float = float("nan")
    fingerprint_dev: float = float("nan")
    """Largest fingerprint deviation from the reference, in units of the dtype's tolerance."""


def tolerance(dtype: torch.dtype) -> tuple[float, float]:
    return TOLERANCES.get(dtype, TOLERANCES[torch.bfloat16])


def _kl(ref: Tensor, cand: Tensor) -> float:
    p = torch.log_softmax(ref.double(), dim=-1)
    q = torch.log_softmax(cand.double(), dim=-1)
    return float((p.exp() * (p - q)).sum(-1).mean())


def compare(cand: TrajectoryReply, ref: TrajectoryReply, index: int, dtype: torch.dtype, *, bitwise: bool = False,
            quality: QualityBudget | None = None, max_fingerprint_dev: float = float("inf"),
            logits_index: int | None = None) -> Comparison:
    """Candidate `index` of `cand` against the reference's only run in `ref` (same script, same seed).

    `max_fingerprint_dev` bounds the fingerprint deviation in quality mode (from the checked runs);
    `logits_index` is the candidate's row of `cand.logits` when the request kept fewer (`logits_of`)."""
    assert cand.fingerprints is not None and ref.fingerprints is not None
    assert cand.tokens is not None and ref.tokens is not None
    fc, fr = cand.fingerprints[index].double(), ref.fingerprints[0].double()
    tc, tr = cand.tokens[index], ref.tokens[0]
    lc = cand.logits[index if logits_index is None else logits_index].double() if cand.logits is not None else None
    lr = ref.logits[0].double() if ref.logits is not None else None
    if fc.shape != fr.shape or tc.shape != tr.shape:
        return Comparison(False, f"the candidate returned {tuple(fc.shape)} rows, the reference {tuple(fr.shape)}")
    if not bool(torch.isfinite(fc[:, :-2]).all()) or (lc is not None and not bool(torch.isfinite(lc).all())):
        return Comparison(False, "the outputs hold NaN or infinity (outputs poisoned before the run were not "
                                 "written, or the computation overflowed)")
    atol, rtol = tolerance(dtype)
    margin = fr[:, -1]
    is_tie = margin <= 2 * (atol + rtol * fr[:, -4].abs())
    agreement = float(((tc == tr) | is_tie).double().mean())
    max_err = float((lc - lr).abs().max()) if lc is not None and lr is not None else float("nan")
    feats = slice(0, fc.shape[1] - 2)  # projections, max, logsumexp
    dev = (fc[:, feats] - fr[:, feats]).abs() / (atol + rtol * fr[:, feats].abs())
    fp_dev = float(dev.max()) if dev.numel() else 0.0
    if quality is not None:
        kl = _kl(lr, lc) if lc is not None and lr is not None else float("nan")
        lp_c, lp_r = fc[:, -2], fr[:, -2]
        scored = torch.isfinite(lp_r)
        ppl_change = float(torch.exp(-lp_c[scored].mean()) / torch.exp(-lp_r[scored].mean()) - 1)
        fig = dict(max_abs_err=max_err, greedy_agreement=agreement, kl=kl, ppl_change=ppl_change,
                   fingerprint_dev=fp_dev)
        if lc is not None and lr is not None and not kl <= quality.max_kl:
            return Comparison(False, f"KL divergence {kl:.4g} exceeds the budget {quality.max_kl:g}", **fig)
        if not ppl_change <= quality.max_ppl_increase:
            return Comparison(False, f"perplexity rises by {100 * ppl_change:.2f}%, beyond the budget "
                                     f"{100 * quality.max_ppl_increase:.2f}%", **fig)
        if not fp_dev <= max_fingerprint_dev:
            return Comparison(False, f"outputs stray from the reference {fp_dev:.3g} tolerances, beyond the "
                                     f"{max_fingerprint_dev:.3g} the checked runs allow", **fig)
        return Comparison(True, f"within the quality budget (KL {kl:.3g}, perplexity {100 * ppl_change:+.2f}%)",
                          **fig)
    if bitwise:
        if lc is not None and lr is not None and not bool((lc == lr).all()):
            return Comparison(False, f"--bitwise: logits differ from the reference (max |diff| {max_err:.3g})",
                              max_err, agreement)
        if not bool((fc[:, :-2] == fr[:, :-2]).all()) or not bool((tc == tr).all()):
            return Comparison(False, "--bitwise: outputs differ from the reference", max_err, agreement)
        return Comparison(True, "identical to the reference", max_err, 1.0)
    if lc is not None and lr is not None:
        err, tol = (lc - lr).abs(), atol + rtol * lr.abs()
        over, allowed = int((err > tol).sum()), int(OUTLIER_SHARE * err.numel())
        if over > allowed or bool((err > OUTLIER_SLACK * tol).any()):
            return Comparison(False, f"logits differ from the reference beyond the {dtype} tolerance (max |diff| "
                                     f"{max_err:.3g}, atol {atol:g}, rtol {rtol:g}: {over} values beyond it, "
                                     f"{allowed} allowed within {OUTLIER_SLACK:g}x)", max_err, agreement)
    bad_fp = dev > FINGERPRINT_SLACK
    if bool(bad_fp.any()):
        rows = int(bad_fp.any(dim=1).sum())
        return Comparison(False, f"logits of {rows} of {fc.shape[0]} rows differ from the reference beyond the "
                                 f"{dtype} tolerance (fingerprint)", max_err, agreement)
    if agreement < 1.0:
        return Comparison(False, f"greedy tokens disagree with the reference on {100 * (1 - agreement):.1f}% of "
                                 "rows (not near ties)", max_err, agreement)
    return Comparison(True, f"matches the reference (max |diff| {max_err:.3g}, greedy agreement 100%)",
                      max_err, agreement)
