"""`EngineConfig`: everything a worker process needs to start, serialisable as JSON.

Imports neither torch nor the model: the worker reads it and enters its sandbox before
anything else is imported (namespaces must be created while the process is single-threaded).
"""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from athanor import settings
from athanor.errors import ConfigError

DEFAULT_BUCKETS = (1, 2, 4, 8, 16, 32, 64)
SERVING_BUCKETS = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512)
"""Decode batch sizes a server captures (up to its --max-seqs): steps of at most 1.5x past 8, so a batch pads by
at most a third (a decode step reads the weights once whatever its rows, so a few padded rows cost little)."""


LAYOUT_KEYS = ("tp", "ep", "dcp", "dp", "pp")


def parse_layout(text: str, flag: str = "--layout") -> dict[str, int]:
    """`tp=2`, `tp=2,ep=2` (or a plan's name, `tp2.ep2`) as degrees by key; a one-line error naming `flag` for any
    other text."""
    out: dict[str, int] = {}
    for part in (x.strip() for x in text.replace(".", ",").split(",")):
        if not part:
            continue
        key = part.rstrip("0123456789=").rstrip("=")
        value = part[len(key):].lstrip("=")
        if key not in LAYOUT_KEYS or not value.isdigit() or int(value) < 1 or key in out:
            raise ConfigError(f"{flag} {text}: give degrees as KEY=N separated by commas, KEY one of "
                              f"{', '.join(LAYOUT_KEYS)} (e.g. tp=2 or tp=2,ep=2)")
        out[key] = int(value)
    return {k: v for k, v in out.items() if v > 1}


def decode_buckets(max_seqs: int, sizes: tuple[int, ...] = DEFAULT_BUCKETS) -> tuple[int, ...]:
    """`sizes` below `max_seqs`, then `max_seqs` itself: every batch an engine of `max_seqs` slots can run has a
    captured graph."""
    return tuple(sorted({b for b in sizes if b < max_seqs} | {max_seqs}))


@dataclass(frozen=True)
class SandboxConfig:
    """What the worker enforces on the candidate code it runs."""

    enabled: bool = True
    """False runs candidates unconfined (trusted code only, e.g. a serving engine with a vetted winner)."""
    network: bool = True
    """Give the worker its own, empty network namespace (and block TCP with Landlock where available)."""
    filesystem: bool = True
    """Allow writes only to the scratch dir, /dev and /dev/shm, and the shared compile cache for a trusted worker
    (Landlock)."""
    memory_limit_bytes: int = 0
    """RLIMIT_DATA of the worker; 0: 90% of physical memory; -1: no limit. (Not RLIMIT_AS: it breaks CUDA.)"""
    namespaces: bool = True
    """Start the worker in its own PID and mount namespaces (`athanor.engine.namespaces`): every process it
    starts dies with it, /dev/shm and TMPDIR are its own tmpfs, the shared compile cache is read-only to it."""


@dataclass(frozen=True)
class EngineConfig:
    """One engine worker: which model, where, how many sequences, which decode buckets."""

    model: str
    """A model name or path as `athanor.model.registry.load_model` accepts (loaded by the worker)."""
    device: str = "cpu"
    dtype: str = ""
    """torch dtype name ("bfloat16", "float32"); empty: as stored (fp32 for random presets)."""
    num_layers: int = 0
    """Cut the model to its first n layers (the fast tier); 0: the whole model (the slow tier)."""
    max_seqs: int = 8
    """Real slots per resident candidate; slot `max_seqs` is the padding slot."""
    max_seq_len: int = 256
    page_size: int = 16
    """Tokens per KV page (`athanor.model.seam`): the unit of KV memory and of prefix sharing."""
    kv_pages: int = 0
    """Pages in each resident's KV pool (scratch not counted). 0: enough for every slot to hold `max_seq_len` tokens,
    the table giving each slot its own pages, shuffled over the pool (so a forward that ignores the table computes
    wrong keys and fails the evaluator's comparison). More than 0: the table starts all scratch and the caller (the
    server's scheduler) assigns the pages."""
    buckets: tuple[int, ...] = DEFAULT_BUCKETS
    """Decode batch sizes captured as CUDA graphs; a batch pads up to the next bucket."""
    use_graphs: bool = True
    """Capture graph-safe candidates' decode on CUDA (ignored on CPU)."""
    max_resident: int = 2
    """Candidates kept built at once (the incumbent and a challenger)."""
    scratch_dir: str = ""
    """The worker's scratch root (candidates get a directory each under it)."""
    cache_dir: str = ""
    """Shared on-disk Inductor / Triton / CUDA caches, kept across swaps and respawns, written only by trusted
    workers (see `trusted`); empty: compile/ under athanor.settings.cache_dir()."""
    socket_path: str = ""
    """Unix socket the worker serves on (a filesystem path: it works across network namespaces)."""
    sandbox: SandboxConfig = field(default_factory=SandboxConfig)
    trusted: bool = False
    """The worker may write `cache_dir`: the evaluator's reference worker, which never imports candidate code, for
    the shared compile cache; a server's worker, for a cache of its own that no other candidate's server loads
    (`athanor.serve.state.serving_cache`). Every other sandboxed worker sees the cache read-only, its own compiles
    going to a cache of its own (Triton and Inductor load a cached binary by key without checking it)."""
    seed: int = 0
    """Seed of random-weight models."""
    layout: dict[str, int] = field(default_factory=dict)
    """Parallel degrees of the replica this engine is rank 0 of (`parse_layout`: keys of `athanor.model.Layout`);
    empty: one device. The other ranks are processes of its own (`athanor.engine.group`)."""
    cpu_threads: int = 0
    """torch intra-op threads of the worker; 0: on CPU, one less than the usable cores (OpenMP threads that
    compete with the caller for cores spin and slow every step many times over); on CUDA, torch's default."""

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), indent=1)

    @classmethod
    def from_json(cls, text: str) -> EngineConfig:
        raw: dict[str, Any] = json.loads(text)
        raw["sandbox"] = SandboxConfig(**raw.get("sandbox", {}))
        raw["buckets"] = tuple(raw.get("buckets", DEFAULT_BUCKETS))
        return cls(**raw)

    def scratch(self) -> Path:
        """The worker's scratch root (candidates' directories, a layout group's rendezvous)."""
        return Path(self.scratch_dir or "/tmp/athanor-engine")

    def compile_cache_dir(self) -> Path:
        if self.cache_dir:
            return Path(self.cache_dir)
        return settings.cache_dir() / "compile"

    def cache_env(self, root: Path | None = None) -> dict[str, str]:
        """Environment that points every compiler cache at `root` (default: the shared directory)."""
        root = root or self.compile_cache_dir()
        return {
            "TORCHINDUCTOR_CACHE_DIR": str(root / "inductor"),
            "TRITON_CACHE_DIR": str(root / "triton"),
            "TRITON_HOME": str(root / "triton-home"),
            "CUDA_CACHE_PATH": str(root / "cuda"),
            # Autotuning results go to the Triton cache too (keyed by kernel, configs and the GPU's
            # target): a worker that starts again (a respawn after a tainted candidate, the other
            # tier's engines, a resumed run) picks a kernel's config without benchmarking every one.
            "TRITON_CACHE_AUTOTUNING": os.environ.get("TRITON_CACHE_AUTOTUNING", "1"),
        }
