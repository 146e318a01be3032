"""`Engine`: the worker's state and the meaning of every RPC, without any transport.

Owns the model (loaded once, on the worker's device), the resident candidates (each with its
module, its `Forward`, its KV state allocated through its `BuildContext` and its
`DecodeRunner`), which one is active, and the swap count. Requests arrive as protocol
dataclasses and leave as replies; a candidate that raises becomes a reply with status "error".
"""

from __future__ import annotations

import gc
import logging
import os
import sys
import time
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from types import ModuleType

import torch

from athanor.engine import integrity, stepwise, trajectory
from athanor.engine import protocol as p
from athanor.engine.candidate import Candidate, format_exception, import_candidate, unload_module
from athanor.engine.config import EngineConfig
from athanor.engine.graphs import DecodeRunner, StepInputs, check_logits
from athanor.engine.group import ALONE, Group
from athanor.engine.isolation import ModuleGuard
from athanor.engine.pages import block_table
from athanor.engine.requests import BadRequest, validate_decode, validate_prefill
from athanor.engine.violations import ViolationWatch
from athanor.errors import CandidateError
from athanor.model import BuildContext, Forward, Layout, Model, PrefillBatch
from athanor.model.sampling import sample
from athanor.seams import layout_mismatch

log = logging.getLogger(__name__)


@dataclass
class Resident:
    """A built candidate kept in the engine."""

    candidate: Candidate
    module: ModuleType
    forward: Forward
    ctx: BuildContext
    runner: DecodeRunner


class Engine:
    def __init__(self, config: EngineConfig, model: Model, sandbox_report: tuple[str, ...] = (),
                 group: Group = ALONE) -> None:
        self.config = config
        self.model = model
        """This rank's shard of the model (the whole model alone)."""
        self.group = group
        self.device = model.device
        self.sandbox_report = sandbox_report
        self.scratch_root = config.scratch() / "candidates"
        self.residents: dict[str, Resident] = {}
        self.active: str | None = None
        self.swap_count = 0
        self._serial = 0
        self.use_graphs = config.use_graphs and self.device.type == "cuda"
        self.watch: ViolationWatch | None = None
        self.guard: ModuleGuard | None = None

    def seal(self, writable: list[str]) -> None:
        """Snapshot module namespaces and install the violation watch (after all engine imports)."""
        self.guard = ModuleGuard()
        self.watch = ViolationWatch(writable)

    # -- swap -----------------------------------------------------------------------------------
    def swap(self, req: p.SwapRequest) -> p.SwapReply:
        t0 = time.perf_counter()
        cand = req.candidate
        try:
            cand.check_hash()
        except CandidateError as e:
            return p.SwapReply(status="invalid", error=str(e), candidate_id=cand.id)
        # Every rank decides alike from the source, so a group refuses together without a collective.
        if mismatch := layout_mismatch(cand.source, self.config.layout, f"candidate {cand.id}"):
            return p.SwapReply(status="invalid", error=mismatch, candidate_id=cand.id)
        if cand.id in self.residents:  # already built: switching costs nothing
            self._activate(cand.id, keep_others=req.keep_incumbent)
            return p.SwapReply(candidate_id=cand.id, graph_safe=self.residents[cand.id].runner.captured,
                               total_s=time.perf_counter() - t0)
        self._restore_namespaces()
        self._serial += 1
        module: ModuleType | None = None
        resident: Resident | None = None
        times = {"build": 0.0, "capture": 0.0, "first": 0.0}
        status: p.Status = "ok"
        error = ""
        try:
            with self.armed():
                module = import_candidate(cand, self.scratch_root / cand.id, self._serial)
                resident = self._build(cand, module, times)
        except Exception as e:  # the candidate is data: any failure keeps the incumbent
            exit_if_device_broken(e)
            status = "error"
            error = str(e) if isinstance(e, CandidateError) else f"candidate {cand.id}: {format_exception(e)}"
        # A layout group's ranks agree before any runs a step (its collectives need every rank), and again after.
        failed = self._agree(status, error)
        built_everywhere = not failed
        if failed and status == "ok":
            status, error = "error", failed
        if built_everywhere:
            try:
                with self.armed():
                    assert resident is not None
                    self._warm(resident, times)
            except Exception as e:
                exit_if_device_broken(e)
                status, error = "error", f"candidate {cand.id}: {format_exception(e)}"
        violations = tuple(self.watch.take()) if self.watch else ()
        # Before _activate's cleanup silently restores them: a candidate that replaced timing or
        # comparison functions at import or build time is reported, not just undone.
        replaced = tuple(trajectory.tampered(self)) if status == "ok" else ()
        if replaced:
            trajectory.restore_critical()
        if violations:
            status = "violation"
            error = "the candidate tried to leave its sandbox: " + "; ".join(violations) + (
                f"\n{error}" if error else "")
        if built_everywhere and (failed := self._agree(status, error)) and status == "ok":
            status, error = "error", failed
        if status != "ok":
            if resident is not None:
                self._release(resident)
            elif module is not None:
                unload_module(module.__name__)
            self._cleanup()
            log.info("swap to %s failed (%s): incumbent %s kept", cand.id, status, self.active)
            return p.SwapReply(status=status, error=error, candidate_id=cand.id, violations=violations)
        assert resident is not None
        self.residents[cand.id] = resident
        self._activate(cand.id, keep_others=req.keep_incumbent)
        self.swap_count += 1
        return p.SwapReply(candidate_id=cand.id, graph_safe=resident.runner.captured, build_s=times["build"],
                           capture_s=times["capture"], first_step_s=times["first"], total_s=time.perf_counter() - t0,
                           replaced=replaced)

    def _build(self, cand: Candidate, module: ModuleType, times: dict[str, float]) -> Resident:
        build = getattr(module, "build", None)
        if not callable(build):
            raise CandidateError(f"candidate {cand.id}: defines no function build(model, ctx)")
        cfg = self.config
        num_pages, table = block_table(cfg, self.device)
        ctx = BuildContext(device=self.device, dtype=self.model.dtype, max_seqs=cfg.max_seqs,
                           max_seq_len=cfg.max_seq_len, page_size=cfg.page_size, num_pages=num_pages,
                           block_table=table, scratch_dir=self.scratch_root / cand.id, rank=self.group.rank,
                           world_size=self.group.size, layout=Layout(**cfg.layout))
        t = time.perf_counter()
        forward = build(self.model, ctx)
        for name in ("prefill", "decode"):
            if not callable(getattr(forward, name, None)):
                raise CandidateError(f"candidate {cand.id}: build() returned {type(forward).__name__}, "
                                     f"which has no {name}() method (expected a Forward)")
        runner = DecodeRunner(forward, cfg.max_seqs, self.model.spec.vocab_size, self.device, cfg.buckets)
        times["build"] = time.perf_counter() - t
        return Resident(cand, module, forward, ctx, runner)

    def _warm(self, resident: Resident, times: dict[str, float]) -> None:
        """Capture a built candidate's decode graphs (else warm a static-shape one's buckets); run its first step."""
        cfg, runner = self.config, resident.runner
        t = time.perf_counter()
        if self.use_graphs and bool(getattr(resident.forward, "graph_safe", False)):
            runner.capture()
        elif runner.static:
            runner.warm()
        times["capture"] = time.perf_counter() - t
        t = time.perf_counter()
        # A first step on the padding slot: proves decode runs and returns [1, vocab].
        one = torch.zeros(1, dtype=torch.long, device=self.device)
        pad = torch.full_like(one, cfg.max_seqs)
        runner.step(StepInputs(one, one, pad, one, torch.zeros(1, device=self.device), torch.ones(1, device=self.device),
                               one))
        self._sync()
        times["first"] = time.perf_counter() - t

    def _agree(self, status: str, error: str) -> str:
        """"" where every rank of the group reached this point with its swap `status` ok, else what the first rank
        that failed said (alone: this engine's own failure)."""
        lines = error.strip().splitlines()
        errors = self.group.agree("" if status == "ok" else f"{status}: {lines[-1] if lines else ''}")
        failed = [(rank, e) for rank, e in enumerate(errors) if e]
        if not failed:
            return ""
        rank, what = failed[0]
        return f"rank {rank} of {self.group.size} failed ({what}); every rank keeps the incumbent"

    # -- residents ------------------------------------------------------------------------------
    def _activate(self, cid: str, keep_others: bool) -> None:
        previous = self.active
        self.active = cid
        for other in list(self.residents):
            if other == cid or (keep_others and other == previous):
                continue
            if keep_others and len(self.residents) <= self.config.max_resident:
                continue
            self._release(self.residents.pop(other))
        self._cleanup()

    def activate(self, req: p.ActivateRequest) -> p.AckReply:
        if req.candidate_id not in self.residents:
            return p.AckReply("invalid", f"activate: {req.candidate_id!r} is not resident "
                                         f"(resident: {', '.join(self.residents) or 'none'})")
        self.active = req.candidate_id
        return p.AckReply()

    def drop(self, req: p.DropRequest) -> p.AckReply:
        if req.candidate_id not in self.residents:
            return p.AckReply("invalid", f"drop: {req.candidate_id!r} is not resident")
        if req.candidate_id == self.active:
            return p.AckReply("invalid", f"drop: {req.candidate_id!r} is active; activate another one first")
        self._release(self.residents.pop(req.candidate_id))
        self._cleanup()
        return p.AckReply()

    def close(self) -> None:
        """Drop every resident candidate, the active one included, and free what they held.

        The end of an engine driven in its caller's process (a benchmark); a worker instead drops candidates
        one at a time through `drop`, which keeps the active one."""
        for cid in list(self.residents):
            self._release(self.residents.pop(cid))
        self.active = None
        self._cleanup()

    def _release(self, resident: Resident) -> None:
        resident.runner.release()
        unload_module(resident.module.__name__)
        resident.forward = None  # type: ignore[assignment]

    def _cleanup(self) -> None:
        """Forget what dropped candidates left behind: namespace edits, Dynamo state, cached memory."""
        self._restore_namespaces()
        if "torch._dynamo" in sys.modules:  # importing Dynamo just to reset it would cost a second
            torch._dynamo.reset()
        gc.unfreeze()  # what a trajectory froze (`stepwise`) may now be the dropped candidate's garbage
        gc.collect()
        if self.device.type == "cuda":
            # Workspaces cuBLAS cached for the dropped candidate's streams, then the allocator's free blocks.
            torch._C._cuda_clearCublasWorkspaces()
            torch.cuda.empty_cache()

    def _restore_namespaces(self) -> None:
        if self.guard is not None:
            self.guard.restore()

    def armed(self) -> AbstractContextManager[None]:
        """The context candidate code runs in: the violation watch (once sealed) records what it attempts."""
        return self.watch.armed() if self.watch else nullcontext()

    def _resident(self, cid: str | None) -> Resident:
        cid = cid or self.active
        if cid is None:
            raise BadRequest("no candidate is loaded: swap one in first")
        if cid not in self.residents:
            raise BadRequest(f"candidate {cid!r} is not resident (resident: {', '.join(self.residents)})")
        return self.residents[cid]

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    # -- running --------------------------------------------------------------------------------
    def run(self, req: p.RunRequest) -> p.RunReply:
        try:
            resident = self._resident(req.candidate_id)
            x: StepInputs | tuple[PrefillBatch, StepInputs]
            if req.kind == "decode":
                x = validate_decode(req, self.config, self.model.spec.vocab_size, self.device)
            elif req.kind == "prefill":
                x = validate_prefill(req, self.config, self.model.spec.vocab_size, self.device)
            else:
                raise BadRequest(f"run: kind must be 'decode' or 'prefill', not {req.kind!r}")
        except BadRequest as e:
            return p.RunReply(status="invalid", error=str(e))
        t = time.perf_counter()
        try:
            with self.armed():
                tokens, logits, used_graph = self._step(resident, req.kind, x)
                self._sync()
        except Exception as e:
            exit_if_device_broken(e)
            return p.RunReply(status="error", error=f"candidate {resident.candidate.id}: {format_exception(e)}")
        elapsed = time.perf_counter() - t
        return p.RunReply(next_tokens=tokens.cpu(), logits=logits.float().cpu() if req.return_logits else None,
                          elapsed_s=elapsed, used_graph=used_graph)

    def _step(self, resident: Resident, kind: str, x: StepInputs | tuple[PrefillBatch, StepInputs]
              ) -> tuple[torch.Tensor, torch.Tensor, bool]:
        if isinstance(x, StepInputs):
            return resident.runner.step(x)
        batch, rows = x
        logits = check_logits(resident.forward.prefill(batch), batch.num_seqs, self.model.spec.vocab_size,
                              "prefill()")
        return sample(logits, rows.temperature, rows.top_p, rows.seeds, rows.positions), logits, False

    def generate(self, req: p.GenerateRequest) -> p.GenerateReply:
        from athanor.engine.requests import generate

        try:
            resident = self._resident(req.candidate_id)
        except BadRequest as e:
            return p.GenerateReply(status="invalid", error=str(e))
        t = time.perf_counter()
        try:
            with self.armed():
                out = generate(resident.runner, resident.forward, req, self.config, self.model.spec.vocab_size,
                               self.device)
        except BadRequest as e:
            return p.GenerateReply(status="invalid", error=str(e))
        except Exception as e:
            exit_if_device_broken(e)
            return p.GenerateReply(status="error", error=f"candidate {resident.candidate.id}: {format_exception(e)}")
        return p.GenerateReply(tokens=out, elapsed_s=time.perf_counter() - t)

    def measure(self, req: p.MeasureRequest) -> p.MeasureReply:
        from athanor.engine.requests import measure

        try:
            resident = self._resident(req.candidate_id)
            with self.armed():
                times, used_graph = measure(resident.runner, resident.forward, req, self.config, self.device)
        except BadRequest as e:
            return p.MeasureReply(status="invalid", error=str(e))
        except Exception as e:
            exit_if_device_broken(e)
            return p.MeasureReply(status="error", error=format_exception(e))
        return p.MeasureReply(times_s=tuple(times), used_graph=used_graph)

    def trajectory(self, req: p.TrajectoryRequest) -> p.TrajectoryReply:
        """Interleaved, timed, poisoned and fingerprinted runs for the evaluator."""
        return trajectory.run_trajectory(self, req)

    def step(self, req: p.StepRequest) -> p.StepReply:
        """One step of a trajectory the evaluator interleaves across processes."""
        return stepwise.run_step(self, req)

    def probe(self, req: p.ProbeRequest) -> p.ProbeReply:
        return integrity.probe(self, req)

    # -- introspection --------------------------------------------------------------------------
    def health(self, req: p.HealthRequest) -> p.HealthReply:
        name = torch.cuda.get_device_name(self.device) if self.device.type == "cuda" else "cpu"
        return p.HealthReply(pid=os.getpid(), active_candidate=self.active or "", device=name,
                             sandbox=self.sandbox_report)

    def stats(self, req: p.StatsRequest) -> p.StatsReply:
        return p.StatsReply(
            active_candidate=self.active or "",
            resident=tuple(self.residents),
            swap_count=self.swap_count,
            rss_bytes=rss_bytes(),
            device_allocated_bytes=torch.cuda.memory_allocated(self.device) if self.device.type == "cuda" else 0,
            candidate_state_bytes=sum(r.ctx.allocated_bytes for r in self.residents.values()),
            model_bytes=self.model.nbytes(),
            violations=self.watch.total if self.watch else 0,
        )

    def handle(self, request: object) -> object:
        """The reply to one request (an "invalid" AckReply for anything that is not a request)."""
        handler = {
            p.HealthRequest: self.health, p.StatsRequest: self.stats, p.SwapRequest: self.swap,
            p.ActivateRequest: self.activate, p.DropRequest: self.drop, p.RunRequest: self.run,
            p.GenerateRequest: self.generate, p.MeasureRequest: self.measure,
            p.TrajectoryRequest: self.trajectory, p.ProbeRequest: self.probe, p.StepRequest: self.step,
        }.get(type(request))
        if handler is None:
            return p.AckReply("invalid", f"unknown RPC {type(request).__name__!r}")
        return handler(request)  # type: ignore[operator]


EXIT_DEVICE_BROKEN = 70


def exit_if_device_broken(e: BaseException) -> None:
    """Exit the worker when `e` left the CUDA context unusable (illegal access, device-side assert).

    Every later kernel would fail too, so the process is beyond repair: dying lets the
    supervisor record the candidate as crashed and bring back a fresh worker with the incumbent.
    """
    text = str(e)
    if "CUDA error" in text or "illegal memory access" in text or "device-side assert" in text:
        log.error("the CUDA context is broken (%s): exiting so the supervisor respawns", text.splitlines()[0])
        logging.shutdown()
        os._exit(EXIT_DEVICE_BROKEN)


def rss_bytes() -> int:
    """Resident set size of this process (from /proc, so no psutil is needed)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        return 0
