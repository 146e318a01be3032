"""The evaluation cascade: static -> smoke -> correctness -> integrity -> timing (fast tier) -> slow tier.

`Evaluator.evaluate(candidate, incumbent)` returns a `Verdict`; a candidate that fails is a verdict, never an
exception. Every run on the candidate engine is the same request: a script run interleaved on (incumbent,
candidate, incumbent's twin) — so the candidate cannot tell a timing from a check — and every run's outputs are
compared with the trusted reference engine's on the same script, timings included (re-verification after timing).
Weights digest, tampered namespaces and candidate threads are probed after the checks and again after timing. The
whole evaluation holds the device lock.
"""

from __future__ import annotations

import logging
import secrets
import time
from dataclasses import replace

import numpy as np
import torch

from athanor.engine import protocol as p
from athanor.engine.candidate import Candidate, baseline_candidate
from athanor.evaluate import objective as obj
from athanor.evaluate import scripts
from athanor.evaluate.config import EvaluateConfig
from athanor.evaluate.correctness import QUALITY_SLACK, Comparison, compare
from athanor.evaluate.engines import IncumbentFailed, ReferenceFailed, TierEngines, twin_of
from athanor.evaluate.figures import ShapeRuns, tier_figures
from athanor.evaluate.lock import device_lock
from athanor.evaluate.progress import Progress, Rejected
from athanor.evaluate.static_checks import check_source
from athanor.evaluate.timing import decide, impossible, next_round_pairs, slowdown_low, too_noisy
from athanor.evaluate.verdict import Speedup, TierResult, Verdict
from athanor.model.registry import load_spec
from athanor.provenance import triton_version
from athanor.traffic import Workload

log = logging.getLogger(__name__)


def versions() -> dict[str, str]:
    return {"torch": torch.__version__, "triton": triton_version() or ""}


class Evaluator:
    """Engines per tier, kept across evaluations (a swap is seconds, a cold start is not)."""

    def __init__(self, config: EvaluateConfig) -> None:
        self.config = config
        self.spec = load_spec(config.model)
        self.dtype = getattr(torch, config.dtype) if config.dtype else torch.float32
        self.dtype_bytes = torch.empty(0, dtype=self.dtype).element_size()
        self._engines: dict[str, TierEngines] = {}
        self._workload: Workload | None = None
        self._last = p.TrajectoryReply()
        self._checked_dev = 0.0
        """Fingerprint deviation of the last correctness check (bounds the timed runs' in quality mode)."""
        self._calibration: dict[tuple[str, str], dict[obj.StepShape, np.ndarray]] = {}
        """Per (tier, incumbent): its step times per timed shape, measured before a challenger was loaded."""

    def with_checks(self, **checks: object) -> Evaluator:
        """An evaluator on this one's engines (and their calibrations) that judges by other checks: `bitwise`,
        `quality` or `static_checks`, which decide on what the engines return and change nothing they run. Closing
        either closes the engines of both."""
        other = set(checks) - {"bitwise", "quality", "static_checks"}
        if other:
            raise ValueError(f"with_checks: {', '.join(sorted(other))} would change what the engines run")
        view = Evaluator(replace(self.config, **checks))  # type: ignore[arg-type]
        view._engines, view._calibration = self._engines, self._calibration
        return view

    def workload(self) -> Workload:
        if self._workload is None:
            from athanor.traffic import load_profile, workload_from_profile

            self._workload = workload_from_profile(load_profile(self.config.traffic))
        return self._workload

    def num_layers(self, tier: str) -> int:
        return self.spec.num_layers if tier == "slow" else min(self.config.fast_layers, self.spec.num_layers)

    def engines(self, tier: str) -> TierEngines:
        if tier not in self._engines:
            engines = TierEngines(self.config, self.num_layers(tier))
            try:
                engines.start()
                if self.config.device.startswith("cuda"):
                    self.warm(engines)
            except BaseException:  # a broken incumbent or reference, or an interrupt: stop what was started
                engines.close()
                raise
            self._engines[tier] = engines
        return self._engines[tier]

    def warm(self, engines: TierEngines) -> None:
        """Run an evaluation's scripts once on both engines' incumbents (the twin built too), unread.

        A fresh CUDA worker's first scripts pay one-off costs (each kernel's module loaded at its first
        launch, library handles and plans, the caching allocator's first growth) several times a script's
        own: costs of the engines' start, which would otherwise land in the first candidate's evaluation,
        some inside its timed windows."""
        cfg = self.config
        timeout_s = cfg.timeouts.check_s
        incumbent = engines.incumbent.incumbent
        engines.prepare(incumbent, cfg.timeouts.swap_s)
        seed = secrets.randbits(31)
        text = scripts.TextSource(self.spec.vocab_size, seed)
        todo = [scripts.smoke_script(text),
                scripts.check_script(text, cfg.max_seqs, cfg.max_seq_len, max_tokens=cfg.check_tokens)]
        todo += [self._shape_script(text, shape, 4) for shape in self._shapes()]
        t0 = time.perf_counter()
        failed = []
        for script in todo:
            reply = engines.run((incumbent.id, twin_of(incumbent).id), script, seed, timeout_s,
                                logits_of=(incumbent.id,))
            if reply.status != "ok":  # the first evaluation meets it again and says so in its verdict
                failed.append(f"{reply.status}: {_first(reply.error)}")
            engines.run_reference(script, seed, timeout_s)
        log.info("engines of %d layers warmed in %.2f s (%d scripts%s)", engines.num_layers,
                 time.perf_counter() - t0, len(todo), f"; the incumbent failed {len(failed)}: {failed[0]}"
                 if failed else "")

    def _shape_script(self, text: scripts.TextSource, shape: obj.StepShape, num_steps: int,
                      warmup: int | None = None) -> scripts.Script:
        """`num_steps` timed steps of `shape` after `warmup` untimed ones (default: the configured warm-up)."""
        cfg = self.config
        warmup = cfg.warmup if warmup is None else warmup
        if shape.kind == "decode":
            return scripts.decode_script(text, shape, num_steps, warmup, cfg.max_seq_len)
        return scripts.prefill_script(text, shape, num_steps, warmup, cfg.max_seqs)

    def _shapes(self) -> list[obj.StepShape]:
        """The shapes the timing stage times: those carrying most of the workload's cost, clipped to the engine."""
        cfg = self.config
        # Room for the warm-up steps too: a context that leaves room for the timed steps alone makes
        # the script prefill a second round of prompts for the last few steps (twice the cost on a CPU).
        return obj.choose_shapes(self.workload(), self.spec, cfg.max_seqs, cfg.max_seq_len,
                                 cfg.decode_pairs + cfg.warmup, self.dtype_bytes, cfg.max_decode_shapes,
                                 cfg.max_prefill_shapes)

    def close(self) -> None:
        for engines in self._engines.values():
            engines.close()
        self._engines.clear()

    def __enter__(self) -> Evaluator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the cascade ------------------------------------------------------------------------------
    def evaluate(self, candidate: Candidate, incumbent: Candidate | None = None) -> Verdict:
        incumbent = incumbent or baseline_candidate()
        run = Progress()
        cfg = self.config
        try:
            if cfg.static_checks:
                findings = check_source(candidate.source)
                if findings:
                    raise Rejected("static", f"{findings[0]}" + (f" (+{len(findings) - 1} more)" if len(findings) > 1
                                                                 else ""))
            if candidate.id in (incumbent.id, twin_of(incumbent).id):
                raise Rejected("static", "the candidate's source is the incumbent's")
            with device_lock(cfg.device):
                for tier in cfg.tiers():
                    run.tiers.append(self._tier(tier, candidate, incumbent, run))
            last = run.tiers[-1]
            decision = decide(last.speedup, last.noise, cfg.margin)
            run.enter("accepted" if decision.accepted else run.stage)
            return self._verdict(candidate, incumbent, run, decision.accepted, run.stage, decision.reason,
                                 "accepted" if decision.accepted else "rejected")
        except Rejected as r:
            run.enter(r.stage)
            return self._verdict(candidate, incumbent, run, False, r.stage, r.reason, r.status)
        except (IncumbentFailed, ReferenceFailed, TimeoutError) as e:
            run.enter(run.stage)
            return self._verdict(candidate, incumbent, run, False, run.stage, str(e), "error")

    def _verdict(self, candidate: Candidate, incumbent: Candidate, run: Progress, accepted: bool, stage: str, reason: str,
                 status: str) -> Verdict:
        last = run.tiers[-1] if run.tiers else None
        return Verdict(
            candidate_id=candidate.id, incumbent_id=incumbent.id, accepted=accepted, stage=stage, reason=reason,
            status=status, speedup=last.speedup if last else Speedup(),
            gpu_s_per_1k_requests=last.candidate_gpu_s_per_1k if last else float("nan"),
            incumbent_gpu_s_per_1k_requests=last.incumbent_gpu_s_per_1k if last else float("nan"),
            tiers=tuple(run.tiers), compile_s=run.compile_s, wall_s=sum(s for _, s in run.stages),
            stages=tuple(run.stages), model=self.config.model, device=self.config.device, versions=versions())

    def _tier(self, tier: str, candidate: Candidate, incumbent: Candidate, run: Progress) -> TierResult:
        cfg, t = self.config, self.config.timeouts
        seed = cfg.seed if cfg.seed is not None else secrets.randbits(31)
        text = scripts.TextSource(self.spec.vocab_size, seed)
        run.enter("smoke")
        engines = self.engines(tier)
        engines.prepare(incumbent, t.swap_s)
        self._calibrate(tier, engines, incumbent, text, seed + 3)  # before the challenger is loaded
        swap = engines.load(incumbent, candidate, t.swap_s)
        tainted = False
        try:
            if swap.status != "ok":
                raise Rejected("smoke", f"{swap.status}: {_first(swap.error)}")
            if swap.replaced:
                raise Rejected("smoke", "the candidate replaced functions of torch, athanor or time: "
                                        + ", ".join(swap.replaced[:5]))
            run.compile_s += swap.build_s + swap.capture_s + swap.first_step_s
            ids = (incumbent.id, candidate.id, twin_of(incumbent).id)  # A, B and A' (the floor), three residents
            self._checked(engines, ids, scripts.smoke_script(text), seed, t.smoke_s, "smoke")
            run.enter("correctness")
            check = self._checked(engines, ids, scripts.check_script(text, cfg.max_seqs, cfg.max_seq_len,
                                                                       max_tokens=cfg.check_tokens), seed + 1,
                                  t.check_s, "correctness")
            run.enter("integrity")
            tainted = self._integrity(engines, "integrity")
            run.enter("timing" if tier == "fast" else "slow")
            result = self._time(tier, engines, ids, text, seed + 2, run.stage, incumbent=incumbent)
            tainted = self._integrity(engines, run.stage)
            assert check is not None
            return replace(result, max_abs_err=check.max_abs_err, greedy_agreement=check.greedy_agreement,
                           kl=check.kl, ppl_change=check.ppl_change)
        except Rejected as r:
            tainted = tainted or r.stage in ("integrity", "timing", "slow")
            raise
        finally:
            engines.unload(candidate, tainted or swap.status != "ok" or bool(swap.replaced))

    def _checked(self, engines: TierEngines, ids: tuple[str, ...], script: scripts.Script, seed: int,
                 timeout_s: float, stage: str) -> Comparison | None:
        """Run `script` on the candidate engine and the reference; Rejected unless the candidate matches."""
        t0 = time.perf_counter()
        reply = engines.run(ids, script, seed, timeout_s, logits_of=ids[1:2])  # the challenger's: the one compared
        t1 = time.perf_counter()
        if reply.status != "ok":
            raise Rejected(stage, f"{reply.status}: {_first(reply.error)}")
        if reply.logits is not None and reply.logits.shape[0] != 1:  # a worker that ignored logits_of
            raise Rejected(stage, f"the candidate engine returned the logits of {reply.logits.shape[0]} runs, not the "
                                  "challenger's alone", status="error")
        if stage == "smoke":  # runs and returns finite [B, vocab] logits; matching is the next stage's
            assert reply.fingerprints is not None
            if not bool(torch.isfinite(reply.fingerprints[1, :, :-2]).all()):
                raise Rejected(stage, "the outputs hold NaN or infinity")
            return None
        ref = engines.run_reference(script, seed, timeout_s)
        bound = QUALITY_SLACK * max(self._checked_dev, 1.0) if stage in ("timing", "slow") else float("inf")
        t2 = time.perf_counter()
        cmp = compare(reply, ref, 1, self.dtype, logits_index=0, bitwise=self.config.bitwise, quality=self.config.quality,
                      max_fingerprint_dev=bound)
        # Where an evaluation's time goes (a fast tier is worth only what it saves over the slow one):
        # the timed windows are the part that measures; the rest is set-up, checks and transfers.
        timed_s = float(reply.times_s.sum()) if reply.times_s is not None else 0.0
        worker = ", ".join(f"{name} {seconds:.2f}" for name, seconds in reply.host_s)
        log.info("%s: %d steps; candidate engine %.2f s (timed %.2f s; worker: %s), reference %.2f s, compare %.2f s",
                 stage, len(script.steps), t1 - t0, timed_s, worker or "-", t2 - t1, time.perf_counter() - t2)
        if stage == "correctness":
            self._checked_dev = cmp.fingerprint_dev
        if not cmp.ok:
            when = " (outputs produced while timing)" if stage in ("timing", "slow") else ""
            raise Rejected(stage, cmp.reason + when)
        self._last = reply
        return cmp

    def _integrity(self, engines: TierEngines, stage: str) -> bool:
        probe = engines.probe()
        if probe.weights_digest != engines.reference_digest:
            raise Rejected(stage, "the candidate modified the model's weights (digest differs from the reference "
                                  "engine's)")
        if probe.tampered:
            raise Rejected(stage, "the candidate replaced functions of torch, athanor or time: "
                                  + ", ".join(probe.tampered[:5]))
        if probe.foreign_threads:
            raise Rejected(stage, "the candidate started threads: " + ", ".join(probe.foreign_threads[:3]))
        return False

    def _time(self, tier: str, engines: TierEngines, ids: tuple[str, ...], text: scripts.TextSource, seed: int,
              stage: str, incumbent: Candidate | None = None) -> TierResult:
        """The tier's figures from timed rounds of every shape, pooled over attempts until the A/A interval is
        narrow enough; with `incumbent`, its times beside the challenger are checked against its calibration."""
        cfg = self.config
        n, full = engines.num_layers, self.spec.num_layers
        shapes = self._shapes()
        pooled: dict[obj.StepShape, np.ndarray] = {}  # [sides, pairs] per shape, over the attempts so far
        for attempt in range(cfg.max_attempts):
            for k, shape in enumerate(shapes):
                per = self._timed_shape(engines, ids, text, shape, seed + 7 * k + 1000 * attempt, stage)
                # Pooled with the pairs of earlier attempts: on a machine that is noisy throughout, a fresh
                # start leaves every attempt as wide as the first, while more pairs narrow the interval (and
                # the median-based statistics shrug off a burst in one attempt).
                pooled[shape] = per if shape not in pooled else np.concatenate([pooled[shape], per], axis=1)
            times = {shape: (t[0], engines.challenger_devices * t[1], t[2]) for shape, t in pooled.items()}
            result = self._figures(tier, times, n, full, engines.bandwidth)
            if not too_noisy(result.noise, cfg.noise_limit):
                break
            log.warning("A/A interval [%.3f, %.3f] is wider than ±%.0f%%: the machine is noisy; measuring more pairs",
                        result.noise.ci_low, result.noise.ci_high, 100 * cfg.noise_limit)
        else:
            raise Rejected(stage, f"too noisy to judge: the A/A interval stayed wider than ±{100 * cfg.noise_limit:.0f}%"
                                  f" ({cfg.max_attempts} attempts)", status="error")
        # Only a verdict that would accept rests on the incumbent's times being its own: a challenger rejected as
        # not faster is rejected whatever it did to them (a heavy one slows a tiny model's incumbent by its caches).
        if incumbent is not None and decide(result.speedup, result.noise, cfg.margin).accepted:
            self._check_incumbent(tier, engines, ids, incumbent, pooled, text, seed + 5000, stage)
        for m in result.measurements:
            if impossible(m.candidate_s, m.floor_s, cfg.physical_slack):
                raise Rejected(stage, f"impossibly fast: {m.kind} step of {1e3 * m.candidate_s:.3f} ms beats the "
                                      f"physical limit {1e3 * m.floor_s:.3f} ms (bytes / measured bandwidth)")
        return result

    def _alone(self, engines: TierEngines, incumbent: Candidate, text: scripts.TextSource, shape: obj.StepShape,
               seed: int, rounds: int = 1) -> np.ndarray:
        """Step times of the incumbent and its twin on `shape` without the challenger (its worker stopped, the trusted
        reference taking its turns). One warm-up step: a calibration that errs slow only makes the check laxer."""
        script = self._shape_script(text, shape, rounds * self.config.calibration_steps, warmup=1)
        reply = engines.run((incumbent.id, twin_of(incumbent).id), script, seed, self.config.timeouts.timing_s,
                            alone=True)
        if reply.status != "ok" or reply.times_s is None:
            raise IncumbentFailed(f"the incumbent failed its calibration ({reply.status}): {_first(reply.error)}")
        return reply.times_s.numpy()[[0, 2]][:, list(script.timed)].ravel()  # row 1: the reference's turns

    def _calibrate(self, tier: str, engines: TierEngines, incumbent: Candidate, text: scripts.TextSource,
                   seed: int) -> None:
        """The incumbent's step times alone, per timed shape, once per incumbent and tier."""
        key = (tier, incumbent.id)
        if key not in self._calibration:
            self._calibration[key] = {shape: self._alone(engines, incumbent, text, shape, seed + k)
                                      for k, shape in enumerate(self._shapes())}

    def _check_incumbent(self, tier: str, engines: TierEngines, ids: tuple[str, ...], incumbent: Candidate,
                         pooled: dict[obj.StepShape, np.ndarray], text: scripts.TextSource, seed: int,
                         stage: str) -> None:
        """Refuse to judge when the incumbent ran slower beside the challenger than by itself: a challenger that slows
        its rivals (its twin alike, so the A/A floor cannot see it) must not win by it. A machine slower for everyone
        is told apart by timing the incumbent alone again, the challenger stopped; a burst of noise in one timing, by
        a fresh round beside the challenger and alone again (a challenger that slows its rivals does it every time)."""
        calibration = self._calibration[(tier, incumbent.id)]
        limit = 1 + self.config.incumbent_drift
        for k, (shape, times) in enumerate(pooled.items()):
            beside = times[[0, 2]].ravel()
            if shape not in calibration or slowdown_low(beside, calibration[shape], seed + k) <= limit:
                continue
            for again in range(2):  # the verdict rests on it
                if again:
                    beside = self._timed_shape(engines, ids, text, shape, seed + k + 77, stage)[[0, 2]].ravel()
                alone = self._alone(engines, incumbent, text, shape, seed + k + again, rounds=4)
                low = slowdown_low(beside, alone, seed + k)
                if low <= limit:
                    break
            if low <= limit:  # as slow alone now: the machine changed, not the challenger's doing
                calibration[shape] = alone
                continue
            raise Rejected(stage, f"the incumbent's {shape.kind} step took at least x{low:.2f} its time alone while "
                                  "beside the challenger: not judged", status="error")

    def _timed_shape(self, engines: TierEngines, ids: tuple[str, ...], text: scripts.TextSource,
                     shape: obj.StepShape, seed: int, stage: str) -> np.ndarray:
        """Step times [sides, pairs] of `shape`, every run verified, in rounds (`timing.next_round_pairs`)."""
        cfg = self.config
        first = cfg.decode_pairs if shape.kind == "decode" else cfg.prefill_pairs
        chunks: list[np.ndarray] = []
        want = first
        while want > 0:
            script = self._shape_script(text, shape, want)
            self._checked(engines, ids, script, seed + 100 * len(chunks), cfg.timeouts.timing_s, stage)
            assert self._last.times_s is not None
            chunks.append(self._last.times_s.numpy()[:, list(script.timed)])
            want = self._more_pairs(chunks, first)
        return np.concatenate(chunks, axis=1)

    def _more_pairs(self, chunks: list[np.ndarray], first: int) -> int:
        """Pairs of the next round of a timed shape, 0 when it is done (`timing.next_round_pairs`)."""
        cfg = self.config
        return next_round_pairs(chunks, first, budget_s=cfg.timing_budget_s, max_pairs=cfg.max_pairs,
                                precision=cfg.precision, max_budget_factor=cfg.max_budget_factor)

    def _figures(self, tier: str, times: ShapeRuns, n: int, full: int, bandwidth: float) -> TierResult:
        return tier_figures(tier, times, self.spec, self.workload(), n, full, self.dtype_bytes, bandwidth,
                            lossy=self.config.quality is not None)


def _first(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else "(no message)"


def evaluate_candidate(candidate: Candidate, config: EvaluateConfig, incumbent: Candidate | None = None) -> Verdict:
    """Evaluate one candidate with engines started for it and stopped after (see `Evaluator` to reuse them)."""
    with Evaluator(config) as evaluator:
        return evaluator.evaluate(candidate, incumbent)
