"""A real SQLite store written through the store's API as a compile and a server would (no compile run: the
browser test in tests/slow has one), with hostile text planted where agents and candidates write.

(Imported by name, not a conftest: test modules elsewhere import their own conftest's names.)"""

from __future__ import annotations

from pathlib import Path

from athanor.evaluate.verdict import Measurement, Speedup, TierResult, Verdict
from athanor.moves.render import render
from athanor.store import Store, open_store
from athanor.traffic import load_profile

PLANTED = "<script>alert('planted')</script>"


def verdict(cid: str, incumbent: str, accepted: bool, stage: str, reason: str, median: float = float("nan"),
            status: str = "rejected") -> dict:
    speed = Speedup(median, median * 0.98, median * 1.02, 64) if median == median else Speedup()
    shapes = (Measurement("decode", 8, 1, 256, 2, 0.0021, 0.0025, speed, 0.7, 0.0015),
              Measurement("prefill", 1, 256, 0, 2, 0.0110, 0.0131, speed, 0.3, 0.0070)) if median == median else ()
    tiers = (TierResult("fast", 2, shapes, speed),) if shapes else ()
    return Verdict(cid, incumbent, accepted, stage, reason, status, speed, 1.5, 1.8, tiers, wall_s=12.5).to_dict()


def fill_store(root: Path) -> Path:
    """The store at `root`, written; `root`."""
    store: Store = open_store(root)
    run = store.add_run("smollm2-135m", "preset:chat", "cpu", config={"budget_s": 480.0})
    profile = load_profile("preset:chat")
    store.add_traffic_snapshot("preset:chat", profile.to_dict(), run_id=run.id)
    ref = store.add_candidate(run.id, "def build(model, ctx):\n    return None\n", author="reference",
                              description="the reference forward (baseline)")
    base = store.add_candidate(run.id, render("fast", {}), parent_id=ref.id, author="variant",
                               description="template, baseline options")
    good = store.add_candidate(run.id, render("fast", {"fused_qkv": True, "rmsnorm": "triton"}), parent_id=base.id,
                               author="variant", description="fused qkv " + PLANTED)
    bad = store.add_candidate(run.id, render("fast", {"fused_gate_up": True}), parent_id=base.id, author="llm",
                              description="a faster MLP")
    store.record_verdict(run.id, verdict(good.id, ref.id, True, "accepted", "x1.190 over the reference", 1.19,
                                         "accepted"), tier="fast")
    store.record_verdict(run.id, verdict(bad.id, ref.id, False, "correctness",
                                         "max |logit error| 3.1 > 0.01 at decode step 2 " + PLANTED), tier="fast")
    store.record_verdict(run.id, verdict(good.id, ref.id, True, "accepted", "confirmed on the whole model", 1.17,
                                         "accepted"), tier="slow")
    store.post(run.id, "llm", "idea", "try fusing the MLP " + PLANTED, candidate_id=bad.id)
    store.finish_run(run.id, summary={"verified": True, "winner_id": good.id,
                                      "speedup": {"median": 1.17, "ci_low": 1.15, "ci_high": 1.19}})
    dep = store.add_deployment(good.id, "http://127.0.0.1:8000", "canary", run_id=run.id)
    store.update_deployment(dep.id, "canary", details={"phases": [{"phase": "pending", "at": 1.0e9},
                                                                  {"phase": "shadow", "at": 1.0e9 + 2}]})
    store.update_deployment(dep.id, "rolled_back", reason="mean KL 0.4 over the budget " + PLANTED,
                            details={"figures": {"mean_kl": 0.4, "top1_agreement": 0.7}})
    moved = load_profile("preset:chat").to_dict()
    moved["input"]["mean"] *= 2
    store.add_traffic_snapshot("watch:log@1", moved, drift={"moved": ["input_length", "prefill_tokens"],
                                                            "recompile": {"session": "s/session-001",
                                                                          "status": "deployed", "winner": good.id}})
    store.close()
    return root
