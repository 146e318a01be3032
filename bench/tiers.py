"""Fast tier against slow tier (issue 6): do fast-tier speedups predict the whole model's, and how
many more candidates does screening on the fast tier evaluate in the same time?

Candidates come from the variant agent (`athanor.agents.variant.VariantSearch`, the best-known
options first, then Optuna's TPE over the moves, told every fast-tier verdict as in a compile
session). Each is evaluated against the reference on the fast tier and on the slow tier with the
evaluators `athanor compile` builds for the device (`CompileConfig.evaluate_config`), and every
verdict is kept in a store under --out. Figures:

- Spearman rank correlation (SciPy) of fast- against slow-tier median speedups, over the candidates
  timed on both tiers (those rejected before timing on either have no speedup to rank);
- misses: candidates the fast tier's screen did not forward (`worth_confirming`: neither accepted nor a
  median over the bar) that the slow tier accepted, and whether one of them
  is the slow tier's best (the candidate the slow tier would have crowned);
- equal budget (`--budget`, default 8 minutes), replayed from the measured wall times of these very
  evaluations in proposal order: "fast + slow" screens every candidate on the fast tier and
  confirms, best projected cost first, those it forwarded, keeping what `athanor compile` keeps
  for confirming (`replay_reserve`); "slow only" evaluates candidates on the slow tier until the budget is spent. Each tier's
  engines start before its first evaluation, timed apart (`startup.json` in the run directory, one entry
  per call), and each strategy is charged the start of the engines it uses once, as one run pays it: a run
  split into device calls would otherwise pay it in the first evaluation of every call. Reported:
  candidates each strategy evaluates, their ratio, and the slow-tier speedup of each one's winner.

`--slow-first N` evaluates only the first N candidates on both tiers and the rest on the fast tier:
the correlation and the misses are figures of the first N, and the replay needs no more than the
slow-tier verdicts of the candidates it reaches: those past N that it confirms are evaluated on the
slow tier after the others (it replays again after each), so a long replay costs fast-tier time, not
slow-tier time, for every candidate it only screens.

    python bench/tiers.py --model smollm2-135m --device cpu --candidates 30 [--traffic preset:chat]
    python bench/tiers.py --model llama-3.1-8b --device cuda --dtype bfloat16 --candidates 50 --slow-first 30 \
        --devices cuda:0,cuda:1 --run-dir DIR --time-limit 400 [--resume] [-v]

The 8B run of 30 candidates on both tiers needs ~40 minutes of one H200 (30 x (fast ~25 s + slow ~60 s));
50 with `--slow-first 10` took three calls of 6-8 minutes at 9b5ea9b. Either is beyond one device command
(10 minutes). So `--devices` runs one lane per GPU (each its own fast and slow engines; the lanes share
the agent and the store, and the rows are replayed in proposal order), `--run-dir DIR` keeps the store
in DIR (carry it from call to call), `--time-limit S` starts no candidate after S seconds, and
`--resume` continues the run in DIR: its rows are rebuilt from the store's verdicts, and the variant
agent is warm-started on their fast-tier verdicts, as a resumed `athanor compile` is. Each call
writes the figures of all rows so far; `-v` logs what each evaluation's scripts cost.

Writes tiers_<model>_<device>.json (under --out, default bench/results). Targets (issue 6):
Spearman >= 0.8, no miss of the slow tier's best, >= 5x more candidates screened at equal budget.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
from scipy.stats import spearmanr

sys.path.insert(0, str(Path(__file__).parent))

from _record import write
from athanor.agents.base import AgentContext
from athanor.agents.variant import VariantConfig, VariantSearch
from athanor.engine.candidate import Candidate, baseline_candidate
from athanor.evaluate import EvaluateConfig, Evaluator, Verdict
from athanor.evaluate.timing import worth_confirming
from athanor.loop.config import CompileConfig
from athanor.loop.reserve import reserve_from
from athanor.model.registry import load_spec
from athanor.store import EvaluationRecord, open_store

NOT_RUN = "not run"
"""The slow-tier stage of a candidate past `--slow-first` that no replay needed confirmed."""


def _row(candidate_id: str, description: str, fast: EvaluationRecord, slow: EvaluationRecord | None) -> dict[str, Any]:
    """One candidate's fast and slow verdicts, from the store's records (so a resumed run rebuilds them);
    `slow` None: not evaluated on the slow tier (stage `NOT_RUN`, figures NaN, accepted None).
    `fast_forwarded`: the fast tier's screen sends it to the slow tier (`timing.worth_confirming`, as
    `athanor compile` decides)."""
    forwarded = worth_confirming(Verdict.from_dict(fast.figures), EvaluateConfig.margin)

    def fields(ev: EvaluationRecord | None) -> tuple[tuple[str, Any], ...]:
        if ev is None:
            return (("accepted", None), ("stage", NOT_RUN), ("reason", ""), *((k, math.nan) for k in (
                "speedup", "ci_low", "ci_high", "gpu_s_per_1k", "wall_s")))
        return (("accepted", ev.accepted), ("stage", ev.stage), ("reason", ev.reason[:200]),
                ("speedup", ev.speedup), ("ci_low", ev.speedup_ci_low), ("ci_high", ev.speedup_ci_high),
                ("gpu_s_per_1k", ev.gpu_s_per_1k), ("wall_s", ev.wall_s))

    return {"candidate_id": candidate_id, "description": description, "fast_forwarded": forwarded,
            **{f"{tier}_{k}": v for tier, ev in (("fast", fast), ("slow", slow)) for k, v in fields(ev)}}


def _on_slow(row: dict[str, Any]) -> bool:
    return bool(row["slow_stage"] != NOT_RUN)


def _rows_so_far(store: Any, run_id: str, slow_first: int) -> tuple[list[dict[str, Any]],
                                                                      list[tuple[str, EvaluationRecord]]]:
    """Rows of the candidates done (on both tiers, or on the fast tier past the first `slow_first`), in
    proposal order, and the fast-tier history (source, record) that warm-starts the variant agent."""
    rows, history = [], []
    for i, cand in enumerate(c for c in store.candidates(run_id) if c.author != "reference"):
        evs = {ev.tier: ev for ev in store.evaluations(run_id, candidate_id=cand.id)}
        if "fast" in evs:
            history.append((cand.source, evs["fast"]))
        if "fast" in evs and ("slow" in evs or i >= slow_first):
            rows.append(_row(cand.id, cand.description, evs["fast"], evs.get("slow")))
    return rows, history


STARTUP_FILE = "startup.json"
"""In the run directory: each call's measured start of each tier's engines (seconds), a list of
{"device", "fast", "slow"}; the replay charges a strategy the median of its tiers' once."""


def _startup_calls(run_dir: Path) -> list[dict[str, Any]]:
    path = run_dir / STARTUP_FILE
    return json.loads(path.read_text()) if path.is_file() else []


def startup_figures(run_dir: Path) -> dict[str, float]:
    """Median start of each tier's engines over the calls so far (0 for a run recorded before they were
    measured apart from its first evaluations)."""
    calls = _startup_calls(run_dir)
    return {tier: float(np.median([c[tier] for c in calls])) if calls else 0.0 for tier in ("fast", "slow")}


def _record_startup(run_dir: Path, device: str, fast_s: float, slow_s: float) -> None:
    calls = [*_startup_calls(run_dir), {"device": device, "fast": fast_s, "slow": slow_s}]
    (run_dir / STARTUP_FILE).write_text(json.dumps(calls, indent=1))


def replay_reserve(rows: list[dict[str, Any]], config: CompileConfig, startup: dict[str, float] | None) -> float:
    """The reserve `athanor compile` keeps for confirming on a machine that has confirmed this model before
    (`athanor.loop.reserve`): from first confirmations that cost the slow tier's start plus one slow-tier evaluation
    timed to the end, as each of these rows' did. The device's default where no row has one yet."""
    start = (startup or {}).get("slow", 0.0)
    walls = [start + r["slow_wall_s"] for r in rows if r["slow_stage"] in ("accepted", "slow")]
    return config.reserve_s(reserve_from(walls))


def equal_budget(rows: list[dict[str, Any]], budget_s: float, reserve_s: float,
                 startup: dict[str, float] | None = None) -> dict[str, Any]:
    """Both strategies replayed from the measured wall times, candidates in proposal order, each charged once
    the start of the engines it uses (`startup`, seconds per tier), as one `athanor compile` is: fast + slow
    starts the fast tier's before screening and the slow tier's when it begins confirming, slow only the slow
    tier's. A replay that reaches a candidate with no slow-tier verdict stops there and names it in
    `needs_slow` (the run then evaluates it and replays again). `within_budget`: fast + slow ended by the
    budget (its first confirmation runs whatever it costs, so a reserve too small shows here)."""
    start = startup or {"fast": 0.0, "slow": 0.0}
    needs: list[str] = []
    spent, screened, accepted = start["fast"], 0, []
    for r in rows:  # fast + slow: screen until the reserve, then confirm the best accepted first
        if spent + r["fast_wall_s"] > budget_s - reserve_s:
            break
        spent += r["fast_wall_s"]
        screened += 1
        if r["fast_forwarded"]:
            accepted.append(r)
    winner, confirmed = None, 0
    spent += start["slow"] if accepted else 0.0
    for r in sorted(accepted, key=lambda r: r["fast_gpu_s_per_1k"]):
        if not _on_slow(r):
            needs.append(r["candidate_id"])
            break
        if confirmed and spent + r["slow_wall_s"] > budget_s:  # the first confirmation always runs
            break
        spent += r["slow_wall_s"]
        confirmed += 1
        if r["slow_accepted"]:
            winner = r
            break
    slow_spent, slow_done, slow_winner = start["slow"], 0, None
    for r in rows:  # slow only
        if not _on_slow(r):
            needs.append(r["candidate_id"])
            break
        if slow_done and slow_spent + r["slow_wall_s"] > budget_s:
            break
        slow_spent += r["slow_wall_s"]
        slow_done += 1
        if r["slow_accepted"] and (slow_winner is None or r["slow_gpu_s_per_1k"] < slow_winner["slow_gpu_s_per_1k"]):
            slow_winner = r
    return {
        "budget_s": budget_s, "reserve_s": reserve_s, "startup_s": start,
        "fast_slow": {"screened": screened, "confirmed": confirmed, "wall_s": spent, "within_budget": spent <= budget_s,
                      "winner": winner["candidate_id"] if winner else None,
                      "winner_slow_speedup": winner["slow_speedup"] if winner else None},
        "slow_only": {"evaluated": slow_done, "wall_s": slow_spent,
                      "winner": slow_winner["candidate_id"] if slow_winner else None,
                      "winner_slow_speedup": slow_winner["slow_speedup"] if slow_winner else None},
        "screened_ratio": screened / max(slow_done, 1),
        "needs_slow": needs,
    }


def replay_file(path: Path, budget_s: float, out: Path) -> int:
    """The equal-budget replay of a recorded run's rows (its measured walls and engine starts) under this code's
    rules: a figure of those measurements, not a new one; the record names the file and its commit."""
    recorded = json.loads(path.read_text())
    rows, startup = recorded["candidates"], recorded["equal_budget"]["startup_s"]
    config = CompileConfig(model=recorded["model"], device=recorded["device"], budget_s=budget_s)
    record = {"benchmark": "tiers-replay", "replayed": str(path), "recorded_environment": recorded.get("environment"),
              "equal_budget": equal_budget(rows, budget_s, replay_reserve(rows, config, startup), startup),
              "equal_budget_default_reserve": equal_budget(rows, budget_s, config.reserve_s(), startup)}
    written = write(record, out / f"{path.stem}_replayed.json")
    for name in ("equal_budget", "equal_budget_default_reserve"):
        eb = record[name]
        print(f"{name}: {eb['reserve_s']:.1f} s kept to confirm: fast+slow screens {eb['fast_slow']['screened']} in "
              f"{eb['fast_slow']['wall_s']:.0f} s (within budget: {eb['fast_slow']['within_budget']}, winner "
              f"{eb['fast_slow']['winner']}), slow only evaluates {eb['slow_only']['evaluated']}: "
              f"{eb['screened_ratio']:.2f}x")
    print(f"-> {written}")
    return 0


def _line(r: dict[str, Any]) -> str:
    slow = f"slow x{r['slow_speedup']:.3f} ({r['slow_stage']}, {r['slow_wall_s']:.0f} s)" if _on_slow(r) else "slow not run"
    return (f"{r['candidate_id']} fast x{r['fast_speedup']:.3f} ({r['fast_stage']}, {r['fast_wall_s']:.0f} s)  {slow}  "
            f"{r['description'][:60]}")


def figures(rows: list[dict[str, Any]]) -> dict[str, Any]:
    timed = [r for r in rows if math.isfinite(r["fast_speedup"]) and math.isfinite(r["slow_speedup"])]
    rho = float(spearmanr([r["fast_speedup"] for r in timed], [r["slow_speedup"] for r in timed]).statistic) \
        if len(timed) >= 3 else float("nan")
    crowned = min((r for r in rows if r["slow_accepted"]), key=lambda r: r["slow_gpu_s_per_1k"], default=None)
    misses = [r["candidate_id"] for r in rows if r["slow_accepted"] and not r["fast_forwarded"]]
    return {"on_both": sum(_on_slow(r) for r in rows), "timed_on_both": len(timed), "spearman": rho, "misses": misses,
            "slow_best": crowned["candidate_id"] if crowned else None,
            "slow_best_missed": bool(crowned and crowned["candidate_id"] in misses)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--devices", default="", help="comma-separated devices, one lane each (e.g. cuda:0,cuda:1); "
                                                  "default: --device")
    ap.add_argument("-v", "--verbose", action="store_true", help="log the evaluations' progress at INFO level")
    ap.add_argument("--dtype", default="")
    ap.add_argument("--traffic", default="preset:chat")
    ap.add_argument("--candidates", type=int, default=30)
    ap.add_argument("--slow-first", type=int, default=-1,
                    help="evaluate only the first N candidates on the slow tier too, the rest on the fast tier "
                         "(and on the slow tier where the replay confirms them); default: all")
    ap.add_argument("--budget", type=float, default=480.0, help="seconds of the equal-budget comparison")
    ap.add_argument("--max-seqs", type=int, default=0, help="engine slots (0: what athanor compile uses)")
    ap.add_argument("--max-seq-len", type=int, default=0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=str(Path(__file__).parent / "results"))
    ap.add_argument("--run-dir", default="", help="keep the store here (default: a temporary directory)")
    ap.add_argument("--resume", action="store_true", help="continue the run in --run-dir")
    ap.add_argument("--report", action="store_true", help="only write the figures of the run in --run-dir")
    ap.add_argument("--time-limit", type=float, default=0.0, help="start no candidate after this many seconds")
    ap.add_argument("--replay", default="", help="only replay the equal budget of a tiers JSON's measured rows "
                                                 "under the current reserve rule (writes *_replayed.json)")
    args = ap.parse_args()
    if args.replay:
        return replay_file(Path(args.replay), args.budget, Path(args.out))
    if (args.resume or args.report) and not args.run_dir:
        ap.error("--resume and --report need --run-dir")
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(asctime)s %(threadName)s %(name)s: %(message)s")
    slow_first = args.candidates if args.slow_first < 0 else args.slow_first
    devices = [d.strip() for d in (args.devices or args.device).split(",") if d.strip()]
    if len(set(devices)) != len(devices):
        # lanes on one device wait for its lock, and an evaluation's wall time would count the wait
        ap.error(f"--devices {args.devices}: one lane per device, each named once")

    def compile_config(device: str) -> CompileConfig:
        return CompileConfig(model=args.model, traffic=args.traffic, device=device, dtype=args.dtype,
                             max_seqs=args.max_seqs, max_seq_len=args.max_seq_len, seed=args.seed,
                             budget_s=args.budget)

    config = compile_config(devices[0])
    spec = load_spec(args.model)
    agent = VariantSearch(VariantConfig(device="cpu" if config.on_cpu else "cuda", moe=spec.moe is not None,
                                        seed=args.seed))
    reference = baseline_candidate()
    lock = threading.Lock()  # the agent, the store and the rows are shared by the lanes
    with tempfile.TemporaryDirectory(prefix="athanor-tiers-") as tmp:
        run_dir = Path(args.run_dir or tmp)
        run_dir.mkdir(parents=True, exist_ok=True)  # a directory: the store's file and startup.json
        store = open_store(run_dir)
        runs = store.runs(limit=1)
        if args.resume or args.report:
            if not runs:
                ap.error(f"{args.run_dir} holds no run")
            run = store.resume_run(runs[0].id) if args.resume else runs[0]  # --report changes nothing
            rows, history = _rows_so_far(store, run.id, slow_first)
            agent.warm_start(history)
            if args.resume:
                print(f"resuming run {run.id}: {len(rows)} candidates done", file=sys.stderr)
        else:
            if runs:
                ap.error(f"--run-dir {args.run_dir} already holds run {runs[0].id}: pass --resume")
            run = store.add_run(args.model, args.traffic, args.device, config={"benchmark": "tiers"})
            store.add_candidate(run.id, reference.source, author="reference")
            rows = []
        started = time.perf_counter()
        in_flight = 0  # candidates proposed and not yet done

        def lane(device: str) -> None:
            """Propose, screen and confirm candidates one after the other on `device` (its own engines;
            lanes on different GPUs share nothing but the agent and the store)."""
            nonlocal in_flight
            lane_config = compile_config(device)
            with Evaluator(lane_config.evaluate_config("fast")) as fast, \
                    Evaluator(lane_config.evaluate_config("slow")) as slow:
                # Each tier's engines start before its first evaluation and are timed apart: a run pays them
                # once (the replay charges them so), not once per device call of a run split into several.
                t0 = time.perf_counter()
                fast.engines("fast")
                t1 = time.perf_counter()
                slow.engines("slow")
                with lock:
                    _record_startup(run_dir, device, t1 - t0, time.perf_counter() - t1)
                while True:
                    with lock:
                        if len(rows) + in_flight >= args.candidates:
                            return
                        if args.time_limit and time.perf_counter() - started > args.time_limit:
                            print(f"{device}: --time-limit {args.time_limit:.0f} s reached: resume to go on",
                                  file=sys.stderr)
                            return
                        proposals = agent.propose(AgentContext(run_id=run.id, incumbent_id=reference.id,
                                                               incumbent_source=reference.source))
                        if not proposals:
                            print("the variant agent has nothing new to propose", file=sys.stderr)
                            return
                        p = proposals[0]
                        on_slow = sum(c.author != "reference" for c in store.candidates(run.id)) < slow_first
                        cand = Candidate.from_source(p.source, parent=p.parent_id, author=p.author,
                                                     description=p.description)
                        store.add_candidate(run.id, cand.source, parent_id=p.parent_id, author=p.author,
                                            description=p.description)
                        in_flight += 1
                    fast_verdict = fast.evaluate(cand, reference).to_dict()
                    with lock:
                        fast_record = store.record_verdict(run.id, fast_verdict, tier="fast")
                        agent.observe([fast_record])
                    slow_verdict = slow.evaluate(cand, reference).to_dict() if on_slow else None
                    with lock:
                        slow_record = store.record_verdict(run.id, slow_verdict, tier="slow") if slow_verdict else None
                        in_flight -= 1
                        rows.append(_row(cand.id, p.description, fast_record, slow_record))
                        print(f"{len(rows):3d} {device} {_line(rows[-1])}", file=sys.stderr, flush=True)

        def confirm_for_replay() -> None:
            """Evaluate on the slow tier the candidates past --slow-first that the replay confirms."""
            startup = startup_figures(run_dir)  # the lanes have recorded theirs; confirming adds none
            replay = equal_budget(rows, args.budget, replay_reserve(rows, config, startup), startup)
            if not replay["needs_slow"]:
                return
            with Evaluator(config.evaluate_config("slow")) as slow:
                slow.engines("slow")  # started outside the evaluations' wall times, as in the lanes
                while replay["needs_slow"]:
                    cid = replay["needs_slow"][0]
                    cand = store.get_candidate(run.id, cid)
                    assert cand is not None  # the replay names candidates of this run
                    record = store.record_verdict(run.id, slow.evaluate(Candidate.from_source(
                        cand.source, parent=cand.parent_id, author=cand.author, description=cand.description),
                        reference).to_dict(), tier="slow")
                    k = next(i for i, r in enumerate(rows) if r["candidate_id"] == cid)
                    fast_record = next(ev for ev in store.evaluations(run.id, candidate_id=cid) if ev.tier == "fast")
                    rows[k] = _row(cid, cand.description, fast_record, record)
                    print(f"confirmed for the replay: {_line(rows[k])}", file=sys.stderr, flush=True)
                    replay = equal_budget(rows, args.budget, replay_reserve(rows, config, startup), startup)

        if not args.report:
            with ThreadPoolExecutor(len(devices)) as pool:
                for done in [pool.submit(lane, d) for d in devices]:
                    done.result()
        order = {c.id: i for i, c in enumerate(store.candidates(run.id))}
        rows.sort(key=lambda r: order[r["candidate_id"]])  # lanes finish out of order; the replay wants proposals'
        if not args.report and len(rows) >= args.candidates:
            confirm_for_replay()
        startup = startup_figures(run_dir)
    record = {"benchmark": "tiers", "model": args.model, "device": args.device, "lanes": devices,
              "traffic": args.traffic,
              "fast_layers": config.evaluate_config("fast").fast_layers,
              "max_seqs": config.evaluate_config("slow").max_seqs,
              "call_wall_s": time.perf_counter() - started,  # this call's; a resumed run spans several
              "slow_first": slow_first,
              "evaluations_s": sum(r["fast_wall_s"] + (r["slow_wall_s"] if _on_slow(r) else 0.0) for r in rows),
              "candidates": rows, **figures(rows),
              "equal_budget": equal_budget(rows, args.budget, replay_reserve(rows, config, startup), startup),
              # what a first run on a machine keeps (no confirmation recorded yet)
              "equal_budget_default_reserve": equal_budget(rows, args.budget, config.reserve_s(), startup)}
    path = write(record, Path(args.out) / f"tiers_{args.model}_{args.device}.json")
    eb = record["equal_budget"]
    print(f"\n{len(rows)} candidates, {record['on_both']} on both tiers, {record['timed_on_both']} timed on both"
          f" -> {path}")
    print(f"Spearman fast vs slow: {record['spearman']:.3f} (target >= 0.8)")
    print(f"fast-tier misses: {len(record['misses'])}; the slow tier's best missed: {record['slow_best_missed']}")
    print(f"{args.budget:.0f} s: fast+slow screens {eb['fast_slow']['screened']} (winner x"
          f"{eb['fast_slow']['winner_slow_speedup'] or float('nan'):.3f}), slow only evaluates "
          f"{eb['slow_only']['evaluated']} (winner x{eb['slow_only']['winner_slow_speedup'] or float('nan'):.3f}):"
          f" {eb['screened_ratio']:.1f}x (target >= 5x); engine start charged once per tier: fast "
          f"{eb['startup_s']['fast']:.0f} s, slow {eb['startup_s']['slow']:.0f} s; {eb['reserve_s']:.0f} s kept to "
          f"confirm, fast+slow used {eb['fast_slow']['wall_s']:.0f} s; with the default "
          f"{record['equal_budget_default_reserve']['reserve_s']:.0f} s: "
          f"{record['equal_budget_default_reserve']['screened_ratio']:.1f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
