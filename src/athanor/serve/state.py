"""The server's state and settings: `ServeOptions` (what `athanor serve` was told), `ServerState` (the tokenizer, the
serving worker's handle, the metrics, the request log and the deployment book the routes share), and the compile
cache a server keeps per starting candidate."""

from __future__ import annotations

import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from athanor import settings
from athanor.engine.candidate_dir import load_candidate_dir
from athanor.engine.config import SERVING_BUCKETS, EngineConfig, SandboxConfig, decode_buckets
from athanor.errors import AthanorError
from athanor.seams import pages_for
from athanor.serve.admin import DeploymentBook, DeploymentRecorder
from athanor.serve.api import APIError
from athanor.serve.config import CanaryConfig, SchedulerConfig, WorkerConfig
from athanor.serve.frontend import WorkerHandle
from athanor.serve.messages import DeploymentState
from athanor.serve.metrics import ServeMetrics
from athanor.serve.reqlog import RequestLog


@dataclass(frozen=True)
class ServeOptions:
    """`athanor serve`'s settings."""

    model: str
    candidate_dir: str = ""
    """Serve this candidate directory from the start; empty: the reference forward (baseline)."""
    served_model_name: str = ""
    """The name clients pass as `model`; empty: `model`."""
    device: str = "cpu"
    dtype: str = ""
    max_seqs: int = 8
    """Concurrent sequences per resident candidate (KV slots)."""
    max_seq_len: int = 2048
    """Context length: prompt plus generated tokens."""
    kv_tokens: int = 0
    """Each candidate's KV pool in tokens; 0: sized by the worker (`athanor.serve.pool_size.build_with_pool`)."""
    threads: int = 0
    """CPU threads of the worker (0: the engine's default)."""
    sandbox: bool = True
    """Run candidate code in the engine's sandbox (no network, confined writes)."""
    admin_token: str = ""
    """Bearer token of the admin API; empty disables it."""
    api_key: str = ""
    """Bearer key every /v1 request must carry (empty: none)."""
    log_path: str = ""
    """Request log (JSONL, `athanor` format); empty: none."""
    log_prompts: bool = False
    store: str = ""
    """Experiment store (path or URL) for deployment records; empty: none."""
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    canary: CanaryConfig = field(default_factory=CanaryConfig)
    layout: dict[str, int] = field(default_factory=dict)
    """Parallel degrees of the replica (`athanor.engine.config.parse_layout`); empty: one device."""
    canaries: bool = True
    """Keep room for a deploy's challenger beside the incumbent. False: one resident, whose KV pool takes the whole
    memory a canary would split, and `/admin/deploy` answers 409."""
    run_dir: str = ""
    """Where the worker's socket, scratch and log go; empty: a fresh temporary directory."""

    @property
    def name(self) -> str:
        return self.served_model_name or self.model


class _IdTokenizer:
    """For models without a tokenizer (random presets): prompts are token ids, text is the ids."""

    stop_ids: tuple[int, ...] = ()

    def encode(self, text: str) -> list[int]:
        raise APIError(400, "this model has no tokenizer: pass the prompt as a list of token ids", param="prompt")

    def decode(self, ids: list[int], skip_special: bool = True) -> str:
        return "".join(f" {i}" for i in ids)

    def apply_chat_template(self, messages: list[dict[str, str]], add_generation_prompt: bool = True) -> str:
        raise APIError(400, "this model has no tokenizer or chat template: use /v1/completions with token ids")


class ServerState:
    def __init__(self, options: ServeOptions) -> None:
        self.options = options
        self.metrics = ServeMetrics()
        self.request_log = RequestLog(options.log_path, options.log_prompts) if options.log_path else None
        self.tokenizer: Any = None
        self.handle: WorkerHandle | None = None
        self.recorder: DeploymentRecorder | None = None
        self.deployments = DeploymentBook(None, options.name)
        self._tmp: tempfile.TemporaryDirectory[str] | None = None

    async def start(self) -> None:
        from athanor.model.registry import load_tokenizer

        o = self.options
        try:
            self.tokenizer = load_tokenizer(o.model)
        except AthanorError:
            self.tokenizer = _IdTokenizer()
        if o.store:
            from athanor.store import open_store

            self.recorder = open_store(o.store)
        self.deployments = DeploymentBook(self.recorder, o.name)
        if o.run_dir:
            run_dir = Path(o.run_dir)
        else:
            self._tmp = tempfile.TemporaryDirectory(prefix="ath-serve-")  # short: unix socket paths are ~100 bytes
            run_dir = Path(self._tmp.name)
        sock = str(run_dir / "serve.sock")
        engine = EngineConfig(model=o.model, device=o.device, dtype=o.dtype, max_seqs=o.max_seqs,
                              max_seq_len=o.max_seq_len, kv_pages=pages_for(o.kv_tokens, EngineConfig.page_size),
                              buckets=decode_buckets(o.max_seqs, SERVING_BUCKETS),
                              scratch_dir=str(run_dir / "scratch"), socket_path=sock,
                              sandbox=SandboxConfig(enabled=o.sandbox), cpu_threads=o.threads,
                              cache_dir=str(serving_cache(o.candidate_dir)), trusted=True,
                              max_resident=2 if o.canaries else 1, layout=o.layout)
        config = WorkerConfig(engine, sock, o.candidate_dir, o.scheduler, o.canary)
        self.handle = WorkerHandle(config, run_dir, on_step=self.metrics.on_step, on_deployment=self.on_deployment)
        status = await self.handle.start()
        self.metrics.set_candidate(status.active_candidate)
        self.metrics.kv_pool_tokens.set(status.kv_pool_tokens)

    async def close(self) -> None:
        if self.handle is not None:
            await self.handle.close()
        if self.request_log is not None:
            self.request_log.close()
        if self._tmp is not None:
            self._tmp.cleanup()

    def on_deployment(self, state: DeploymentState) -> None:
        done = self.deployments.update(state)
        if done is None:
            return
        self.metrics.deployments.labels(done.phase).inc()
        if done.phase == "deployed" and self.handle is not None:
            self.handle.serve_candidate_dir(done.candidate_dir)
            self.metrics.set_candidate(done.candidate_id)

    def probes(self) -> tuple[tuple[int, ...], ...]:
        """Real text for the canary to mirror when there is no traffic (64-token pieces of the corpus)."""
        from athanor.traffic.corpus import encoded_sentences

        if isinstance(self.tokenizer, _IdTokenizer):
            return ()
        flat = [t for s in encoded_sentences(self.tokenizer) for t in s]
        return tuple(tuple(flat[i:i + 64]) for i in range(0, min(len(flat), 64 * 8), 64))


def serving_cache(candidate_dir: str) -> Path:
    """The compile caches of a server that starts with `candidate_dir` (empty: the reference), writable by its
    worker: a restart with the same candidate loads its compiled kernels instead of compiling them again. One
    directory per starting candidate's content hash, apart from the compile loop's shared cache, so what a server
    compiled is loaded only by a server of that same candidate (and the candidates its admin deploys into it)."""
    from athanor.engine.candidate import baseline_candidate

    cand = load_candidate_dir(candidate_dir) if candidate_dir else baseline_candidate()
    return settings.cache_dir() / "serve" / cand.id
