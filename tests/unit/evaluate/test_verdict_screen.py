"""The verdict explains itself: the bar and what it is made of, the correctness evidence, the traffic timed."""

from __future__ import annotations

from athanor.commands.evaluate import explain, render
from athanor.evaluate.verdict import Speedup, TierResult, Verdict


def _verdict(accepted: bool, kl: float = float("nan")) -> Verdict:
    tier = TierResult(tier="slow", num_layers=2, speedup=Speedup(1.08, 1.05, 1.11, 200),
                      noise=Speedup(1.006, 0.99, 1.02, 200), max_abs_err=3e-6, greedy_agreement=1.0, kl=kl)
    v = Verdict(candidate_id="c", incumbent_id="i", accepted=accepted, stage="timing",
                reason="faster: x1.080 [1.050, 1.110] clears 1.016", status="accepted" if accepted else "rejected",
                speedup=tier.speedup, tiers=[tier], model="tiny-dense", device="cpu",
                versions={"torch": "2.13.0", "triton": ""})
    return v


def test_the_bar_is_one_plus_the_margin_plus_the_aa_bias_and_is_named() -> None:
    v = explain(_verdict(True), margin=0.01, traffic="preset:chat")
    assert abs(v["bar"]["threshold"] - 1.016) < 1e-9 and abs(v["bar"]["aa_bias"] - 0.006) < 1e-9
    screen = render(v)
    assert screen.startswith("ACCEPTED at timing")
    assert "must clear 1.016 = 1 + margin 0.010 + the A/A bias 0.006" in screen and "noise floor" in screen
    assert "max |logit error| 3e-06, greedy tokens agree 100.0%" in screen
    assert "for traffic preset:chat" in screen and "over 200 timed pairs" in screen
    assert "KL" not in screen  # not measured outside quality mode: not shown as a number


def test_quality_mode_shows_its_kl() -> None:
    assert "KL 0.0021" in render(explain(_verdict(False, kl=0.0021), margin=0.01, traffic="preset:code"))


def test_a_verdict_read_back_from_json_keeps_its_unmeasured_figures_nan() -> None:
    """A resumed run reads its verdicts back from the store's JSON, where NaN is written null: they must explain
    themselves as the live ones do (a KL never measured is still not a number, not None)."""
    import json
    import math

    live = _verdict(True)
    back = Verdict.from_dict(json.loads(json.dumps(live.to_dict())))
    assert math.isnan(back.tiers[0].kl) and math.isnan(back.gpu_s_per_1k_requests)
    assert render(explain(back, margin=0.01, traffic="preset:chat")) == render(explain(live, margin=0.01,
                                                                                       traffic="preset:chat"))
