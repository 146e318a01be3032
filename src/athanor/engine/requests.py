"""Checking RunRequests against the engine's limits, and the in-engine loops (generate, measure).

Every check names the field and the limit, so a caller's mistake becomes an "invalid" reply
that says what to fix, and never reaches candidate code (a slot out of range would otherwise
write outside the KV cache).
"""

from __future__ import annotations

import time

import torch
from torch import Tensor

from athanor.engine import protocol as p
from athanor.engine.config import EngineConfig
from athanor.engine.graphs import DecodeRunner, StepInputs, check_logits
from athanor.model import Forward, PrefillBatch
from athanor.model.sampling import sample


class BadRequest(Exception):
    """A request the engine refuses (becomes status "invalid")."""


def _vec(t: object, name: str, n: int | None, dtype: torch.dtype, device: torch.device) -> Tensor:
    if not isinstance(t, Tensor) or t.dim() != 1:
        raise BadRequest(f"run: {name} must be a 1-d tensor")
    if n is not None and t.shape[0] != n:
        raise BadRequest(f"run: {name} has {t.shape[0]} entries, expected {n}")
    if dtype == torch.long and t.is_floating_point():
        raise BadRequest(f"run: {name} must be integer, not {t.dtype}")
    return t.to(device=device, dtype=dtype)


def _check_slots(slots: Tensor, cfg: EngineConfig) -> None:
    if slots.numel() and (int(slots.min()) < 0 or int(slots.max()) >= cfg.max_seqs):
        bad = next(s for s in slots.tolist() if not 0 <= s < cfg.max_seqs)
        raise BadRequest(f"run: slot {bad} is out of range: this engine has slots 0..{cfg.max_seqs - 1} "
                         f"(max_seqs={cfg.max_seqs})")
    if len(set(slots.tolist())) != slots.numel():
        raise BadRequest("run: a slot appears twice in one batch")


def _rows(req: p.RunRequest, n: int, positions: Tensor, device: torch.device) -> StepInputs:
    temperature = _vec(req.temperature, "temperature", n, torch.float32, device)
    top_p = _vec(req.top_p, "top_p", n, torch.float32, device)
    if n and (float(top_p.min()) <= 0 or float(top_p.max()) > 1):
        raise BadRequest("run: top_p must lie in (0, 1]")
    seeds = _vec(req.seeds, "seeds", n, torch.long, device)
    empty = torch.empty(0, dtype=torch.long, device=device)
    return StepInputs(empty, positions, empty, empty, temperature, top_p, seeds)


def validate_decode(req: p.RunRequest, cfg: EngineConfig, vocab_size: int, device: torch.device) -> StepInputs:
    n = int(req.tokens.shape[0]) if isinstance(req.tokens, Tensor) and req.tokens.dim() == 1 else -1
    if n <= 0:
        raise BadRequest("run: decode tokens must be a non-empty 1-d tensor [B]")
    tokens = _vec(req.tokens, "tokens", n, torch.long, device)
    positions = _vec(req.positions, "positions", n, torch.long, device)
    slots = _vec(req.slots, "slots", n, torch.long, device)
    seq_lens = _vec(req.seq_lens, "seq_lens", n, torch.long, device)
    _check_slots(slots, cfg)
    if int(tokens.min()) < 0 or int(tokens.max()) >= vocab_size:
        raise BadRequest(f"run: token ids must lie in [0, {vocab_size})")
    if int(positions.min()) < 0 or int(positions.max()) >= cfg.max_seq_len:
        raise BadRequest(f"run: positions must lie in [0, {cfg.max_seq_len}) (max_seq_len)")
    rows = _rows(req, n, positions, device)
    return StepInputs(tokens, positions, slots, seq_lens, rows.temperature, rows.top_p, rows.seeds)


def validate_prefill(req: p.RunRequest, cfg: EngineConfig, vocab_size: int, device: torch.device
                     ) -> tuple[PrefillBatch, StepInputs]:
    if req.cu_seqlens is None:
        raise BadRequest("run: a prefill needs cu_seqlens [B+1]")
    cu = _vec(req.cu_seqlens, "cu_seqlens", None, torch.long, device)
    slots = _vec(req.slots, "slots", None, torch.long, device)
    n = int(slots.shape[0])
    if n == 0 or cu.shape[0] != n + 1 or int(cu[0]) != 0 or bool((cu[1:] <= cu[:-1]).any()):
        raise BadRequest("run: cu_seqlens must be [B+1], start at 0 and strictly increase")
    total = int(cu[-1])
    tokens = _vec(req.tokens, "tokens", total, torch.long, device)
    positions = _vec(req.positions, "positions", total, torch.long, device)
    seq_lens = _vec(req.seq_lens, "seq_lens", n, torch.long, device)
    _check_slots(slots, cfg)
    if int(tokens.min()) < 0 or int(tokens.max()) >= vocab_size:
        raise BadRequest(f"run: token ids must lie in [0, {vocab_size})")
    if int(seq_lens.min()) < 0 or int((seq_lens + cu[1:] - cu[:-1]).max()) > cfg.max_seq_len:
        raise BadRequest(f"run: a sequence would exceed max_seq_len={cfg.max_seq_len}")
    last = positions[cu[1:] - 1]
    batch = PrefillBatch(tokens, cu, positions, slots, seq_lens)
    return batch, _rows(req, n, last, device)


def generate(runner: DecodeRunner, forward: Forward, req: p.GenerateRequest, cfg: EngineConfig, vocab_size: int,
             device: torch.device) -> tuple[tuple[int, ...], ...]:
    """Prefill the prompts into slots 0..n-1 and decode `max_new_tokens` tokens each."""
    n = len(req.prompts)
    if not 0 < n <= cfg.max_seqs:
        raise BadRequest(f"generate: {n} prompts; this engine holds 1..{cfg.max_seqs} sequences")
    if any(not prompt for prompt in req.prompts):
        raise BadRequest("generate: every prompt needs at least one token")
    if max(len(q) for q in req.prompts) + req.max_new_tokens > cfg.max_seq_len:
        raise BadRequest(f"generate: prompt + max_new_tokens exceeds max_seq_len={cfg.max_seq_len}")
    if any(not 0 <= t < vocab_size for q in req.prompts for t in q):
        raise BadRequest(f"generate: token ids must lie in [0, {vocab_size})")
    lens = [len(q) for q in req.prompts]
    cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.long, device=device)
    positions = torch.cat([torch.arange(k, dtype=torch.long, device=device) for k in lens])
    slots = torch.arange(n, dtype=torch.long, device=device)
    batch = PrefillBatch(torch.tensor([t for q in req.prompts for t in q], dtype=torch.long, device=device),
                         cu, positions, slots, torch.zeros(n, dtype=torch.long, device=device))
    temperature = torch.full((n,), req.temperature, dtype=torch.float32, device=device)
    top_p = torch.full((n,), req.top_p, dtype=torch.float32, device=device)
    seeds = req.seed + torch.arange(n, dtype=torch.long, device=device)
    pos = torch.tensor(lens, dtype=torch.long, device=device) - 1
    logits = check_logits(forward.prefill(batch), n, vocab_size, "prefill()")
    token = sample(logits, temperature, top_p, seeds, pos)
    out = [token]
    for _ in range(req.max_new_tokens - 1):
        pos = pos + 1
        token, _, _ = runner.step(StepInputs(token, pos, slots, pos, temperature, top_p, seeds))
        out.append(token)
    rows = torch.stack(out, dim=1).cpu().tolist()
    return tuple(tuple(r) for r in rows)


def measure(runner: DecodeRunner, forward: Forward, req: p.MeasureRequest, cfg: EngineConfig,
            device: torch.device) -> tuple[list[float], bool]:
    """Seconds per step of `req.iters` timed steps (device events on CUDA) and whether graphs ran."""
    if req.kind not in ("decode", "prefill") or req.iters < 1 or req.batch_size < 1:
        raise BadRequest("measure: kind must be decode or prefill, with iters >= 1 and batch_size >= 1")
    if not 0 < req.context_len < cfg.max_seq_len:
        raise BadRequest(f"measure: context_len must lie in [1, {cfg.max_seq_len})")
    b = req.batch_size
    gen = torch.Generator(device="cpu").manual_seed(0)
    used_graph = False

    def step() -> None:
        nonlocal used_graph
        if req.kind == "decode":
            # Rows beyond max_seqs share slots: the timing does not depend on which slot a row uses.
            slots = torch.arange(b, dtype=torch.long, device=device) % cfg.max_seqs
            pos = torch.full((b,), req.context_len, dtype=torch.long, device=device)
            tokens = torch.randint(0, 100, (b,), generator=gen).to(device)
            zeros = torch.zeros(b, dtype=torch.float32, device=device)
            _, _, used_graph = runner.step(StepInputs(tokens, pos, slots, pos, zeros, zeros + 1, pos))
        else:
            k = req.context_len
            tokens = torch.randint(0, 100, (k * b,), generator=gen).to(device)
            cu = torch.arange(b + 1, dtype=torch.long, device=device) * k
            positions = torch.arange(k, dtype=torch.long, device=device).repeat(b)
            slots = torch.arange(b, dtype=torch.long, device=device) % cfg.max_seqs
            forward.prefill(PrefillBatch(tokens, cu, positions, slots, torch.zeros(b, dtype=torch.long, device=device)))

    for _ in range(req.warmup):
        step()
    times: list[float] = []
    for _ in range(req.iters):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            step()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1000)
        else:
            t = time.perf_counter()
            step()
            times.append(time.perf_counter() - t)
    return times, used_graph
