"""Scripted, interleaved, timed and fingerprinted runs for the evaluator (`TrajectoryRequest`, `ProbeRequest`).

A trajectory is a fixed script of prefill and decode steps (real text, teacher-forced). Each
step runs once on every listed resident candidate, in a per-step random order (never starting
with the resident that ended the previous step, so every run follows a switch), inside this
process, so RPC overhead never pollutes a timing and A and B share the machine's state
(A B / B A ...). Every run is both timed and checked: the candidate cannot tell a timed step
from a checked one because there is no difference. Per step and candidate:

- the KV pool is poisoned at the start: each resident's pages are dealt to its slots again in a new order
  (`athanor.engine.pages.deal`), so nothing a candidate kept in its pages lines up with this script;
- outputs are poisoned first (the graph's static output buffers are filled with NaN; in the
  eager path the tensor a candidate returned is poisoned after it was read), so a candidate
  that does not write its outputs returns NaN;
- time from device events on the engine's stream followed by a device-wide synchronise (CUDA),
  or a clock bound when this module was imported (CPU), so a candidate rebinding
  `time.perf_counter` or `torch.cuda.Event.elapsed_time` cannot change it. A captured decode step
  is timed on the device alone: its inputs are copied in and padded before the window, a short
  device-side sleep lets the host queue the replay before the start event is reached, and the
  window holds only the replay (decode + sampling). Otherwise the host's launch latency and its
  jitter (tens of microseconds, a few percent of a 1-2 ms step) would be timed too, and they are
  the engine's, the same for every candidate. An eager step (prefill, a candidate that is not
  graph-safe) is timed from an idle device, so its host work, which is the candidate's, counts;
- the garbage collector is off while steps run (a collection inside a timed step is noise);
- a fingerprint of every logits row: P projections on seeded random unit directions, max,
  logsumexp and the log-probability of the next scripted token, plus the argmax; full logits
  only for steps marked `keep_logits`;
- a forward that makes its own greedy tokens (`decode_greedy`) must return its logits' argmax,
  else the trajectory ends in an error naming the rows.

`tampered` and `foreign_threads` are what the evaluator's probe (`athanor.engine.integrity`) reports beside the
weights' digest: the namespaces a candidate changed (timing and comparison functions included) and threads
started by candidate code.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import random
import threading
import time
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from athanor.engine import protocol as p
from athanor.engine.candidate import MODULE_PREFIX, candidate_failure, collector_off
from athanor.engine.graphs import check_logits
from athanor.engine.pages import check_shared, deal, shared_prefix
from athanor.engine.requests import BadRequest, validate_decode, validate_prefill
from athanor.errors import CandidateError
from athanor.model import PrefillBatch

if TYPE_CHECKING:
    from athanor.engine.core import Engine, Resident

log = logging.getLogger(__name__)

# Bound at import, before any candidate runs: rebinding the module attributes later changes nothing here.
_clock = time.perf_counter
_Event = torch.cuda.Event
_elapsed_ms = torch.cuda.Event.elapsed_time
_cuda_sync = torch.cuda.synchronize
_device_sleep = torch.cuda._sleep

LAUNCH_AHEAD_CYCLES = 200_000
"""Device clock cycles of the sleep queued before a timed replay (~0.1 ms on an H200): time for the
host to queue the replay before the device reaches the start event. Doubled, up to 64x, whenever
the start event had already passed when the replay was queued (the device waited for the host)."""


def _critical() -> dict[str, Any]:
    """Timing and comparison functions a cheating candidate would want to replace."""
    import torch.testing

    names = {
        "time.perf_counter": time.perf_counter, "time.perf_counter_ns": time.perf_counter_ns,
        "time.monotonic": time.monotonic, "time.monotonic_ns": time.monotonic_ns, "time.time": time.time,
        "time.process_time": time.process_time,
        "torch.cuda.Event": torch.cuda.Event, "torch.cuda.synchronize": torch.cuda.synchronize,
        "torch.cuda._sleep": torch.cuda._sleep,
        "torch.allclose": torch.allclose, "torch.equal": torch.equal, "torch.isclose": torch.isclose,
        "torch.testing.assert_close": torch.testing.assert_close,
        "torch.matmul": torch.matmul, "torch.nn.functional.linear": torch.nn.functional.linear,
    }
    for attr in ("elapsed_time", "record", "synchronize", "query"):
        names[f"torch.cuda.Event.{attr}"] = vars(torch.cuda.Event).get(attr)
    for attr in ("__eq__", "__ne__", "__sub__", "abs", "max", "float", "copy_", "fill_", "clone", "allclose",
                 "equal", "__matmul__"):
        names[f"torch.Tensor.{attr}"] = getattr(torch.Tensor, attr)
    return names


_CRITICAL = _critical()


def _resolve(path: str) -> Any:
    parts = path.split(".")
    obj: Any = {"time": time, "torch": torch}[parts[0]]
    for i, part in enumerate(parts[1:], start=1):
        if isinstance(obj, type) and i == len(parts) - 1:
            return vars(obj).get(part, getattr(obj, part, None))
        obj = getattr(obj, part, None)
    return obj


def tampered(engine: Engine) -> list[str]:
    """Names of guarded functions or namespace entries that differ from the snapshot (no restore)."""
    changed = [name for name, obj in _CRITICAL.items() if _resolve(name) is not obj]
    guard = engine.guard
    if guard is not None:
        for name, (module, saved) in guard._modules.items():
            current = vars(module)
            changed += [f"{name}.{k}" for k, v in saved.items() if k in current and current[k] is not v]
        for cls, saved in guard._classes:
            current_cls = vars(cls)
            changed += [f"{cls.__module__}.{cls.__qualname__}.{k}" for k, v in saved.items()
                        if k in current_cls and current_cls[k] is not v]
    return sorted(set(changed))


def restore_critical() -> None:
    """Put back the timing and comparison functions of `_CRITICAL` (those outside the ModuleGuard's view)."""
    for name, obj in _CRITICAL.items():
        if obj is None or _resolve(name) is obj:
            continue
        owner_path, _, attr = name.rpartition(".")
        owner = _resolve(owner_path) if "." in owner_path else {"time": time, "torch": torch}[owner_path]
        with contextlib.suppress(AttributeError, TypeError):  # read-only slots of builtin types
            setattr(owner, attr, obj)


def foreign_threads() -> list[str]:
    """Live threads whose code comes from a candidate module."""
    out = []
    for t in threading.enumerate():
        target = getattr(t, "_target", None)
        origin = getattr(target, "__module__", None) or type(t).__module__ or ""
        if origin.startswith(MODULE_PREFIX) or type(t).__module__.startswith(MODULE_PREFIX):
            out.append(f"{t.name} ({origin})")
    return out


def fingerprint_projection(vocab: int, num: int, seed: int, device: torch.device) -> Tensor:
    """`num` random unit directions in logit space, fixed by `seed`: the projections of a `fingerprint`."""
    gen = torch.Generator(device="cpu").manual_seed(seed)
    r = torch.randn(vocab, num, generator=gen, dtype=torch.float32)
    return (r / r.norm(dim=0, keepdim=True)).to(device)  # [V, P]


def fingerprint(logits: Tensor, proj: Tensor, next_tokens: Tensor | None) -> tuple[Tensor, Tensor]:
    """([B, P + 4] fp32, argmax [B]) of logits [B, V]: projections, max, logsumexp, log p(next), top-2 margin."""
    x = logits.float()
    lse = torch.logsumexp(x, dim=-1)
    if next_tokens is not None:
        logprob = x.gather(1, next_tokens.view(-1, 1)).squeeze(1) - lse
    else:
        logprob = torch.full_like(lse, float("nan"))
    top2 = x.topk(2, dim=-1).values
    feats = torch.cat([x @ proj, top2[:, :1], lse[:, None], logprob[:, None], (top2[:, 0] - top2[:, 1])[:, None]],
                      dim=1)
    return feats, x.argmax(dim=-1)


def as_run_request(step: p.ScriptStep) -> p.RunRequest:
    b = int(step.slots.shape[0])
    return p.RunRequest(step.kind, step.tokens, step.positions, step.slots, step.seq_lens,
                        torch.zeros(b), torch.ones(b), torch.zeros(b, dtype=torch.long), cu_seqlens=step.cu_seqlens)


def validate_step(engine: Engine, step: p.ScriptStep) -> Any:
    """A script step's inputs on the engine's device, checked against its limits (BadRequest otherwise)."""
    run = as_run_request(step)
    cfg, vocab, device = engine.config, engine.model.spec.vocab_size, engine.device
    if why := check_shared(step.shared, step.slots.tolist(), step.seq_lens.tolist(), cfg):
        raise BadRequest(f"trajectory: {why}")
    if step.kind == "decode":
        return validate_decode(run, cfg, vocab, device)
    if step.kind == "prefill":
        return validate_prefill(run, cfg, vocab, device)
    raise BadRequest(f"trajectory: step kind must be decode or prefill, not {step.kind!r}")


def poison_outputs(resident: Resident) -> None:
    for _graph, out_tokens, out_logits in resident.runner._graphs.values():
        out_logits.fill_(float("nan"))
        out_tokens.fill_(-1)


def _run_one(engine: Engine, resident: Resident, x: Any, kind: str) -> tuple[Tensor, Tensor | None, bool]:
    """(logits, the step's greedy tokens (None for a prefill), whether a graph ran)."""
    if kind == "decode":  # script rows are greedy (`as_run_request`): the argmax graph, as greedy serving runs
        tokens, logits, used_graph = resident.runner.step(x, greedy=True)
        return logits, tokens, used_graph
    batch: PrefillBatch = x[0]
    out = check_logits(resident.forward.prefill(batch), batch.num_seqs, engine.model.spec.vocab_size, "prefill()")
    return out, None, False


def check_greedy_tokens(resident: Resident, tokens: Tensor | None, argmax: Tensor) -> None:
    """A forward that makes its own greedy tokens (`decode_greedy`) must hand back its logits' argmax: checked on every
    run, timed ones included (they are the same runs), so a candidate cannot win by skipping or faking them."""
    if tokens is None or not resident.runner.forward_tokens:
        return
    if not torch.equal(tokens, argmax):
        rows = (tokens != argmax).nonzero().flatten().tolist()
        raise CandidateError(f"decode_greedy() returned tokens that are not the argmax of its logits (rows {rows}: "
                             f"{tokens[rows].tolist()} against {argmax[rows].tolist()})")


class StepTimer:
    """Runs one step and times it: device events on CUDA (see the module docstring), the clock on CPU."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.device = engine.device
        self.cuda = self.device.type == "cuda"
        self.ahead = LAUNCH_AHEAD_CYCLES

    def run(self, resident: Resident, x: Any, kind: str) -> tuple[Tensor, Tensor | None, bool, float]:
        """(logits [B, V], greedy tokens [B] of a decode step, whether a graph ran, seconds)."""
        if not self.cuda:
            t = _clock()
            logits, tokens, graph = _run_one(self.engine, resident, x, kind)
            return logits, tokens, graph, _clock() - t
        start, end = _Event(enable_timing=True), _Event(enable_timing=True)
        _cuda_sync(self.device)  # every stream, not only the engine's: nothing else runs in the window
        # Greedy rows (`as_run_request`), as in `_run_one`; staged before the window opens.
        staged = resident.runner.stage(x, greedy=True) if kind == "decode" else None
        if staged is None:
            start.record()
            logits, tokens, graph = _run_one(self.engine, resident, x, kind)
            end.record()
            _cuda_sync(self.device)
            return logits, tokens, graph, _elapsed_ms(start, end) / 1000
        cuda_graph, out_tokens, out_logits = staged
        _device_sleep(self.ahead)
        start.record()
        cuda_graph.replay()
        if start.query() and self.ahead < 64 * LAUNCH_AHEAD_CYCLES:
            self.ahead *= 2  # the device reached the start before the replay was queued: sleep longer next time
        end.record()
        _cuda_sync(self.device)
        rows = int(x.tokens.shape[0])
        return out_logits[:rows].clone(), out_tokens[:rows].clone(), True, _elapsed_ms(start, end) / 1000


def _allocator_counts(device: torch.device) -> tuple[int, int]:
    """(device allocations, allocation retries) of the caching allocator so far; zeros off CUDA."""
    if device.type != "cuda":
        return 0, 0
    stats = torch.cuda.memory_stats(device)
    return int(stats.get("num_device_alloc", 0)), int(stats.get("num_alloc_retries", 0))


def _order(rng: random.Random, residents: list[Resident], last: Resident | None) -> list[int]:
    """A random order of the residents for one step whose first is not the one that ran last: every run
    follows a switch, so no side runs on what its own previous run left warm (unless a request lists
    one resident twice)."""
    n = len(residents)
    while True:
        perm = rng.sample(range(n), n)
        if n == 1 or residents[perm[0]] is not last or all(r is last for r in residents):
            return perm


def run_trajectory(engine: Engine, req: p.TrajectoryRequest) -> p.TrajectoryReply:
    t_start = _clock()
    try:
        residents = [engine._resident(cid) for cid in req.candidate_ids]
        if not residents or not req.steps:
            raise BadRequest("trajectory: needs at least one candidate and one step")
        vocab, device = engine.model.spec.vocab_size, engine.device
        inputs = [validate_step(engine, step) for step in req.steps]
        unknown = [cid for cid in req.logits_of if cid not in req.candidate_ids]
        if unknown:
            raise BadRequest(f"trajectory: logits_of names {', '.join(unknown)}, which the request does not list")
    except BadRequest as e:
        return p.TrajectoryReply(status="invalid", error=str(e))
    # Where the worker's wall goes besides the timed windows (logged by the evaluator: an evaluation's set-up and
    # checks are what a fast tier must keep small): inputs to the device, each run's window with its syncs and
    # staging, fingerprints read back, kept logits copied.
    spent = dict.fromkeys(("inputs", "windows", "fingerprints", "logits"), 0.0)
    spent["inputs"] = _clock() - t_start
    if req.poison and engine.config.kv_pages == 0:
        for i, resident in enumerate(residents):
            deal(resident.ctx.table, resident.ctx.num_pages, req.seed + i)
    proj = fingerprint_projection(vocab, req.num_projections, req.seed, device)
    nexts = [s.next_tokens.to(device) if s.next_tokens is not None else None for s in req.steps]
    order = random.Random(req.seed)
    num_c, num_s = len(residents), len(req.steps)
    logits_of = [req.candidate_ids.index(cid) for cid in req.logits_of] if req.logits_of else list(range(num_c))
    times = torch.zeros(num_c, num_s, dtype=torch.float64)
    feats: list[list[Tensor]] = [[] for _ in residents]
    argmax: list[list[Tensor]] = [[] for _ in residents]
    kept: list[list[Tensor]] = [[] for _ in residents]
    used_graph = False
    timer = StepTimer(engine)
    allocs = _allocator_counts(device)
    current = "?"
    gc.collect()
    try:
        with collector_off(), engine.armed():
            last: Resident | None = None
            for s, (step, x) in enumerate(zip(req.steps, inputs, strict=True)):
                for c in _order(order, residents, last):
                    resident = last = residents[c]
                    current = resident.candidate.id
                    if req.poison:
                        poison_outputs(resident)
                    t0 = _clock()
                    with shared_prefix(resident.ctx.table, step.shared):
                        logits, tokens, graph, seconds = timer.run(resident, x, step.kind)
                    t1 = _clock()
                    times[c, s] = seconds
                    used_graph |= graph
                    f, a = fingerprint(logits, proj, nexts[s])
                    check_greedy_tokens(resident, tokens, a)
                    feats[c].append(f.cpu())
                    argmax[c].append(a.cpu())
                    t2 = _clock()
                    if step.keep_logits:  # a copy (the original is poisoned below); every run makes it, so that
                        # none starts after a transfer the others do not (only the requested ones are sent)
                        copy = logits.float().cpu().clone()
                        if c in logits_of:
                            kept[c].append(copy)
                    spent["windows"] += t1 - t0
                    spent["fingerprints"] += t2 - t1
                    spent["logits"] += _clock() - t2
                    if req.poison and not graph:
                        logits.fill_(float("nan"))  # a candidate that hands back the same buffer unwritten shows NaN
    except Exception as e:
        return p.TrajectoryReply(status="error", error=candidate_failure(e, current))
    grew = [b - a for a, b in zip(allocs, _allocator_counts(device), strict=True)]
    if any(grew):  # a cudaMalloc or a flushed cache inside timed steps costs milliseconds and syncs the device
        log.info("trajectory of %d steps x %d candidates: %d device allocations, %d allocation retries",
                 num_s, num_c, *grew)
    violations = tuple(engine.watch.take()) if engine.watch else ()
    logits_out = torch.stack([torch.cat(kept[c]) for c in logits_of]) if kept[logits_of[0]] else None
    spent["total"] = _clock() - t_start
    return p.TrajectoryReply(
        status="violation" if violations else "ok",
        error="the candidate tried to leave its sandbox: " + "; ".join(violations) if violations else "",
        times_s=times, fingerprints=torch.stack([torch.cat(f) for f in feats]),
        tokens=torch.stack([torch.cat(a) for a in argmax]), logits=logits_out, used_graph=used_graph,
        violations=violations, host_s=tuple(spent.items()))
