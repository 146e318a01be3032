"""What a compile session hands over: `winner/` (deployable) and `report.json` + `report.md`.

`winner/` holds the candidate source, its manifest, and the verification and benchmark record
(the slow-tier verdict against the reference, or against the session's incumbent when it was given
one), so `athanor serve --candidate DIR` can run it and `athanor evaluate DIR/candidate.py` can check
it again. With an incumbent, `report.json` has an `incumbent` entry (id, directory) and its speedup
says `"against": "incumbent"` with the incumbent's id; without one, `"against": "reference"`.
`precision` records how candidates were judged (`CompileConfig.precision`); in quality mode it
holds the budget and the winner's measured KL divergence and perplexity change, so a reader sees
that the speedup was bought with a bounded loss of fidelity.
"""

from __future__ import annotations

import dataclasses
import json
import math
import shutil
from collections import Counter
from typing import TYPE_CHECKING, Any

from athanor.engine.candidate_dir import write_candidate_dir
from athanor.evaluate import Verdict
from athanor.provenance import environment

if TYPE_CHECKING:
    from athanor.loop.session import Session


def _finite(x: float) -> float | None:
    return x if isinstance(x, float) and math.isfinite(x) else None


def _shapes(verdict: Verdict) -> list[dict[str, Any]]:
    tier = verdict.tiers[-1] if verdict.tiers else None
    if tier is None:
        return []
    return [{"kind": m.kind, "batch_size": m.batch_size, "tokens": m.tokens, "context_len": m.context_len,
             "layers_timed": m.num_layers, "baseline_ms": 1e3 * m.incumbent_s, "winner_ms": 1e3 * m.candidate_s,
             "speedup": _finite(m.speedup.median), "ci_low": _finite(m.speedup.ci_low),
             "ci_high": _finite(m.speedup.ci_high), "weight": m.weight} for m in tier.measurements]


def _lineage(session: Session, candidate_id: str) -> list[dict[str, str]]:
    chain, seen = [], set()
    cid: str | None = candidate_id
    while cid and cid not in seen:
        seen.add(cid)
        record = session.store.get_candidate(session.run_id, cid)
        if record is None:
            break
        chain.append({"id": cid, "author": record.author, "description": record.description})
        cid = record.parent_id or None
    return chain


def write_report(session: Session, elapsed_s: float, interrupted: bool) -> dict[str, Any]:
    cfg, out = session.config, session.config.out_dir
    winner_id = session.winner_id()
    evaluations = [ev for ev in session.evaluations() if ev.stage != "worker-lost"]  # the lost are run again
    per_agent = Counter(ev.author for ev in evaluations if ev.tier == "fast")
    per_tier = Counter(ev.tier for ev in evaluations)
    output_tokens = session.profile.output.mean * 1000  # per 1,000 requests
    summary: dict[str, Any] = {
        "run_id": session.run_id, "model": cfg.model, "traffic": cfg.traffic, "device": cfg.device,
        "budget_s": cfg.budget_s, "elapsed_s": elapsed_s, "interrupted": interrupted,
        "verified": winner_id is not None, "winner_id": winner_id,
        "candidates_evaluated": {"per_agent": dict(per_agent), "per_tier": dict(per_tier)},
        "leaderboard": [dataclasses.asdict(e) for e in session.store.leaderboard(session.run_id, 10)],
        "environment": environment(cfg.device),
        "precision": cfg.precision,
    }
    if cfg.dashboard:
        summary["dashboard"] = f"{cfg.dashboard.rstrip('/')}/runs/{session.run_id}"
    if session.workers_lost:
        summary["workers_lost"] = list(session.workers_lost)
    against = "the reference"
    if session.incumbent is not None:
        m = session.incumbent.manifest
        summary["incumbent"] = {"id": session.incumbent.id, "dir": str(cfg.incumbent), "author": m.author,
                                "description": m.description}
        against = f"the incumbent {session.incumbent.id} ({cfg.incumbent})"
    winner_dir = out / "winner"
    if winner_id is None:
        shutil.rmtree(winner_dir, ignore_errors=True)
        screened, judged = per_tier.get("fast", 0), per_tier.get("slow", 0)
        if interrupted:  # say what was judged: an interrupt drops the evaluation in progress
            summary["reason"] = (f"interrupted after {screened} candidate(s) screened on the fast tier and {judged} "
                                 f"judged on the slow tier, none of them confirmed faster than {against}; the "
                                 "evaluation in progress was dropped (--resume continues the run)")
        else:
            summary["reason"] = f"no candidate was confirmed faster than {against} on the slow tier"
    else:
        verdict = session.slow_verdicts[winner_id]
        cand = session.sources[winner_id]
        s = verdict.speedup
        baseline_s, winner_s = verdict.incumbent_gpu_s_per_1k_requests, verdict.gpu_s_per_1k_requests
        speedup = {"median": s.median, "ci_low": s.ci_low, "ci_high": s.ci_high, "tier": "slow",
                   "against": "reference"}
        if session.incumbent is not None:
            speedup.update(against="incumbent", incumbent_id=session.incumbent.id)
        summary.update({
            "speedup": speedup,
            "gpu_s_per_1k_requests": {"baseline": _finite(baseline_s), "winner": _finite(winner_s)},
            "projected_output_tokens_per_s": {"baseline": _finite(output_tokens / baseline_s),
                                              "winner": _finite(output_tokens / winner_s)},
            "shapes": _shapes(verdict), "lineage": _lineage(session, winner_id),
            "winner": {"id": winner_id, "author": cand.manifest.author, "description": cand.manifest.description},
        })
        if cfg.quality is not None and verdict.tiers:
            summary["precision"].update(winner_kl=_finite(verdict.tiers[-1].kl),
                                        winner_ppl_change=_finite(verdict.tiers[-1].ppl_change))
        fast = session.fast_verdicts.get(winner_id)
        write_candidate_dir(cand, winner_dir)
        record = {"slow": verdict.to_dict(), "fast": fast.to_dict() if fast else None, "traffic": cfg.traffic,
                  "model": cfg.model, "environment": summary["environment"], "precision": summary["precision"]}
        if "incumbent" in summary:
            record["incumbent"] = summary["incumbent"]
        (winner_dir / "verification.json").write_text(json.dumps(record, indent=2) + "\n")
    (out / "report.json").write_text(json.dumps(summary, indent=2, default=str) + "\n")
    (out / "report.md").write_text(render_markdown(summary))
    return summary


def render_markdown(summary: dict[str, Any]) -> str:
    lines = [f"# athanor compile: {summary['model']} on {summary['device']}", "",
             f"Traffic `{summary['traffic']}`, budget {summary['budget_s']:.0f} s, elapsed "
             f"{summary['elapsed_s']:.0f} s{' (interrupted)' if summary['interrupted'] else ''}.", ""]
    page = summary.get("dashboard")
    if page:
        lines += [f"The run on the dashboard: <{page}>", ""]

    def candidate(cid: str) -> str:
        return f"[`{cid}`]({page}/candidates/{cid})" if page else f"`{cid}`"

    against = "reference"
    if "incumbent" in summary:
        i = summary["incumbent"]
        against = f"incumbent `{i['id']}`"
        lines += [f"Every speedup below is quoted against the **incumbent `{i['id']}`** ({i['author']}: "
                  f"{i['description']}; `{i['dir']}`), not the reference forward, which competed as a candidate.", ""]
    precision = summary.get("precision") or {}
    if precision.get("mode") == "quality":
        q = precision["quality_budget"]
        lines += [f"**Quality mode**: lossy candidates (such as lower-precision weights) were admitted within a mean "
                  f"KL divergence of {q['max_kl']:g} and a perplexity increase of {100 * q['max_ppl_increase']:g}% "
                  "against the reference: a speedup below is what that budget buys (with the winner's own loss "
                  "beside it), not a lossless one.", ""]
    elif precision.get("mode") == "bitwise":
        lines += ["Bitwise mode: every admitted candidate's outputs are identical to the reference's.", ""]
    if summary["verified"]:
        s, w = summary["speedup"], summary["winner"]
        lines += [f"**Winner {candidate(w['id'])}** ({w['author']}: {w['description']}): **x{s['median']:.3f}** over the "
                  f"{against}, 95% CI [{s['ci_low']:.3f}, {s['ci_high']:.3f}], confirmed on the slow tier (whole "
                  "model).", ""]
        if precision.get("winner_kl") is not None or precision.get("winner_ppl_change") is not None:
            kl, ppl = precision.get("winner_kl"), precision.get("winner_ppl_change")
            lines += [f"Its loss on the slow tier: KL {'-' if kl is None else f'{kl:.3g}'}, perplexity "
                      f"{'-' if ppl is None else f'{100 * ppl:+.2f}%'}.", ""]
        g, t = summary["gpu_s_per_1k_requests"], summary["projected_output_tokens_per_s"]
        lines += ["| | baseline | winner |", "|---|---|---|",
                  f"| device-seconds per 1,000 requests | {g['baseline']:.1f} | {g['winner']:.1f} |",
                  f"| projected output tokens/s | {t['baseline']:.1f} | {t['winner']:.1f} |", "",
                  "| step | batch | tokens | context | baseline ms | winner ms | speedup [95% CI] | weight |",
                  "|---|---|---|---|---|---|---|---|"]
        for m in summary["shapes"]:
            lines.append(f"| {m['kind']} | {m['batch_size']} | {m['tokens']} | {m['context_len']} | "
                         f"{m['baseline_ms']:.2f} | {m['winner_ms']:.2f} | x{m['speedup'] or float('nan'):.3f} "
                         f"[{m['ci_low'] or float('nan'):.3f}, {m['ci_high'] or float('nan'):.3f}] | {m['weight']:.2f} |")
        lines += ["", "Lineage: " + " <- ".join(f"`{c['id']}` ({c['author']})" for c in summary["lineage"]), ""]
    else:
        lines += [f"No verified winner: {summary.get('reason', '')}.", ""]
    if summary.get("workers_lost"):
        lines += ["Screeners lost during the run (each screen was run again): "
                  + "; ".join(summary["workers_lost"]) + ".", ""]
    lines += ["## Candidates evaluated", "",
              "Per agent (fast tier): " + ", ".join(f"{k} {v}" for k, v in summary["candidates_evaluated"]["per_agent"]
                                                    .items()),
              "Per tier: " + ", ".join(f"{k} {v}" for k, v in summary["candidates_evaluated"]["per_tier"].items()),
              "", "## Leaderboard", "", "| rank | candidate | author | tier | speedup [95% CI] | s / 1k requests |",
              "|---|---|---|---|---|---|"]
    for e in summary["leaderboard"]:
        lines.append(f"| {e['rank']} | {candidate(e['candidate_id'])} | {e['author']} | {e['tier']} | x{e['speedup']:.3f} "
                     f"[{e['speedup_ci_low']:.3f}, {e['speedup_ci_high']:.3f}] | {e['gpu_s_per_1k']:.1f} |")
    return "\n".join(lines) + "\n"
