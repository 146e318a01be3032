"""Text generation over any `Forward`: prefill, then decode step by step, sampling each token.

This is the simple, synchronous path (the CLI and tests use it); the serving engine runs
its own step loop with continuous batching.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from athanor.errors import ConfigError
from athanor.model.sampling import sample
from athanor.model.seam import DecodeBatch, Forward, make_prefill_batch


@dataclass(frozen=True)
class SamplingParams:
    max_new_tokens: int = 64
    temperature: float = 0.0
    """0 is greedy."""
    top_p: float = 1.0
    seed: int | None = None
    stop_ids: tuple[int, ...] = ()
    """Token ids that end a sequence (not included in the output)."""

    def __post_init__(self) -> None:
        if self.max_new_tokens < 1:
            raise ConfigError(f"--max-new-tokens {self.max_new_tokens}: must be at least 1")
        if self.temperature < 0:
            raise ConfigError(f"--temperature {self.temperature}: must be >= 0")
        if not 0 < self.top_p <= 1:
            raise ConfigError(f"--top-p {self.top_p}: must be in (0, 1]")


@dataclass
class GenerationResult:
    tokens: list[list[int]]
    """Generated ids per prompt, without stop tokens."""
    num_prompt_tokens: int
    prefill_s: float
    decode_s: float
    num_decode_steps: int = 0
    first_logits: list[torch.Tensor] = field(default_factory=list)

    @property
    def num_generated(self) -> int:
        return sum(len(t) for t in self.tokens)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@torch.inference_mode()
def generate(forward: Forward, prompts: list[list[int]], params: SamplingParams, device: torch.device,
             max_seq_len: int) -> GenerationResult:
    """Generate for each prompt in its own slot (0..B-1) until a stop id or `max_new_tokens`."""
    if not prompts or any(len(p) == 0 for p in prompts):
        raise ConfigError("--prompt: every prompt needs at least one token")
    longest = max(len(p) for p in prompts)
    if longest + params.max_new_tokens > max_seq_len:
        raise ConfigError(
            f"--prompt is {longest} tokens and --max-new-tokens {params.max_new_tokens}: more than the "
            f"{max_seq_len}-token context; shorten the prompt or lower --max-new-tokens"
        )
    num = len(prompts)
    base_seed = params.seed if params.seed is not None else int(torch.randint(0, 2**31 - 1, ()))
    seeds = torch.arange(num, device=device) + base_seed  # one stream per sequence
    temperature = torch.full((num,), params.temperature, device=device)
    top_p = torch.full((num,), params.top_p, device=device)
    lengths = [len(p) for p in prompts]

    def pick(logits: torch.Tensor, rows: list[int]) -> list[int]:
        positions = torch.tensor([lengths[r] for r in rows], device=device)
        return sample(logits, temperature[rows], top_p[rows], seeds[rows], positions).tolist()

    _sync(device)
    start = time.perf_counter()
    logits = forward.prefill(make_prefill_batch(prompts, list(range(num)), device=device))
    next_ids = pick(logits, list(range(num)))
    _sync(device)
    prefill_s = time.perf_counter() - start

    out: list[list[int]] = [[] for _ in prompts]
    live = list(range(num))
    steps = 0
    start = time.perf_counter()
    while True:
        still = []
        for row, tok in zip(live, next_ids):
            if tok in params.stop_ids:
                continue
            out[row].append(tok)
            if len(out[row]) < params.max_new_tokens:
                still.append((row, tok))
        if not still:
            break
        live = [r for r, _ in still]
        as_long = dict(dtype=torch.long, device=device)
        batch = DecodeBatch(
            tokens=torch.tensor([t for _, t in still], **as_long),  # type: ignore[arg-type]
            positions=torch.tensor([lengths[r] for r in live], **as_long),  # type: ignore[arg-type]
            slots=torch.tensor(live, **as_long),  # type: ignore[arg-type]
            seq_lens=torch.tensor([lengths[r] for r in live], **as_long),  # type: ignore[arg-type]
        )
        next_ids = pick(forward.decode(batch), live)
        for r in live:
            lengths[r] += 1
        steps += 1
    _sync(device)
    return GenerationResult(out, sum(len(p) for p in prompts), prefill_s, time.perf_counter() - start, steps)
