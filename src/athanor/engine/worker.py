"""The engine worker process: `python -m athanor.engine.worker CONFIG.json`.

Order matters: read the request key from stdin and the config, make the worker's private mounts
(`athanor.engine.namespaces`: /proc, /dev/shm, TMPDIR, the compile cache), point the compile
caches at the cache this worker may use, enter the sandbox and drop every capability while still
single-threaded (no torch yet), then import torch, load the model once, and answer requests on a
zmq ROUTER socket until told to stop or orphaned. A request whose MAC does not verify under the key
(`athanor.engine.auth`) is dropped unread; the others are handled one at a time, in arrival order,
whichever client sent them.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from athanor.engine import auth, group
from athanor.engine.config import EngineConfig
from athanor.engine.credentials import drop_credentials
from athanor.engine.namespaces import launch_info, private_mounts
from athanor.engine.sandbox import default_writable, enter_sandbox

if TYPE_CHECKING:
    from athanor.engine.core import Engine
    from athanor.engine.group import Group
    from athanor.model import Model

log = logging.getLogger(__name__)


def exit_with_parent() -> None:
    """End this process when its parent (the supervisor) is gone, even while the main thread is busy in a
    candidate: a daemon thread polls the parent's pid."""
    parent = os.getppid()

    def poll() -> None:
        while True:
            time.sleep(0.5)
            if os.getppid() != parent:
                os._exit(3)

    threading.Thread(target=poll, daemon=True).start()


def _load_model(config: EngineConfig, group: Group) -> Model:
    """The model, or this rank's shard of it in a layout group."""
    import torch

    from athanor.model.registry import load_model
    from athanor.model.shard import shard_model

    dtype = getattr(torch, config.dtype) if config.dtype else None
    model = load_model(config.model, device=config.device, dtype=dtype, seed=config.seed)
    if config.num_layers:
        model = model.slice(config.num_layers)
    if group.size > 1:
        model = shard_model(model, group.rank, config.layout.get("tp", 1), config.layout.get("ep", 1))
    return model


def _threads(config: EngineConfig, ranks: int) -> None:
    import torch

    if config.cpu_threads:
        torch.set_num_threads(config.cpu_threads)
    elif config.device == "cpu":  # the usable cores shared by the group's ranks, one left to the caller
        torch.set_num_threads(max(1, (len(os.sched_getaffinity(0)) - 1) // ranks))


def boot(config: EngineConfig, transport: str = "") -> Engine:
    """Enter the sandbox, load the model once and return the sealed `Engine` (no socket yet).

    The engine's RPC loop (`serve`) and the serving loop (`athanor.serve.worker`) both start here;
    `transport` is their report line on how requests are authenticated. In a layout group this process is rank
    0: it starts the other ranks once in its sandbox (`athanor.engine.group`).
    """
    ranks = group.group_size(config)
    scratch = Path(config.scratch_dir)
    (scratch / "tmp").mkdir(parents=True, exist_ok=True)
    shared = config.compile_cache_dir()
    if config.sandbox.enabled:
        lines, cache = private_mounts(config, launch_info())
    else:
        lines, cache = [], shared
    for name, value in config.cache_env(cache).items():
        os.environ[name] = value
    os.environ["TMPDIR"] = str(scratch / "tmp")
    writable = default_writable(scratch, Path(config.socket_path).parent, shared if cache == shared else None)
    report = ([transport] if transport else []) + lines + list(enter_sandbox(config.sandbox, writable, ranks > 1))
    if config.sandbox.enabled:
        report.append(drop_credentials())  # last: the namespaces, mounts and Landlock above need capabilities
    if ranks > 1:
        group.spawn_followers(config)
        report.append(f"layout: rank 0 of {ranks} ({', '.join(f'{k}={v}' for k, v in config.layout.items())}), "
                      "the other ranks in this sandbox")
    for line in report:
        if "NOT" in line or "DISABLED" in line:
            log.warning("sandbox: %s", line)
        else:
            log.info("sandbox: %s", line)
    sys.dont_write_bytecode = True  # candidates' __pycache__ would only litter the scratch dir

    import torch

    from athanor.engine.core import Engine

    if config.device.startswith("cuda:"):
        # Triton launches and CUDA graphs run on the current device, not the one a tensor names
        torch.cuda.set_device(torch.device(config.device))
    _threads(config, ranks)
    rank0 = group.start(config, 0)
    t0 = time.perf_counter()
    model = _load_model(config, rank0)
    log.info("loaded %s on %s in %.2fs", config.model, config.device, time.perf_counter() - t0)
    engine = Engine(config, model, tuple(report), rank0)
    _rebind_like_dynamo(torch)
    engine.seal([str(w) for w in writable])
    torch.set_grad_enabled(False)  # an inference engine: no autograd state on any candidate's tensors
    return engine


def boot_follower(config: EngineConfig, rank: int) -> tuple[Engine, Group]:
    """Rank `rank` of a layout group, started by rank 0 inside its sandbox (whose namespaces, Landlock domain,
    dropped capabilities and environment it inherits): join the group, load this rank's shard, seal."""
    import torch

    from athanor.engine.core import Engine

    _threads(config, group.group_size(config))
    mine = group.start(config, rank)
    engine = Engine(config, _load_model(config, mine), (f"rank {rank} of {mine.size}: in rank 0's sandbox",), mine)
    _rebind_like_dynamo(torch)
    engine.seal([config.scratch_dir])
    torch.set_grad_enabled(False)
    return engine, mine


def _rebind_like_dynamo(torch: Any) -> None:
    """Do to torch's namespace what importing Dynamo does, before the namespaces are snapshotted.

    Dynamo's import wraps torch.manual_seed in `torch._disable_dynamo` (unless it is wrapped already). A
    candidate that compiles (torch.compile, flex attention) imports Dynamo, so without this it reads as one
    that replaced a torch function. Importing Dynamo here instead would cost every worker a second of its
    start and every swap a `torch._dynamo.reset()`."""
    if torch.manual_seed is torch.random.manual_seed:
        import torch.jit._builtins

        torch.manual_seed = torch._disable_dynamo(torch.manual_seed)
        torch.jit._builtins._register_builtin(torch.manual_seed, "aten::manual_seed")


def serve(config: EngineConfig, key: bytes) -> int:
    import zmq

    from athanor.engine import protocol as p

    socket_path = Path(config.socket_path)
    engine = boot(config, auth.REPORT)
    ctx = zmq.Context()
    sock = ctx.socket(zmq.ROUTER)
    sock.setsockopt(zmq.LINGER, 0)
    socket_path.unlink(missing_ok=True)
    sock.bind(f"ipc://{socket_path}")
    exit_with_parent()
    dropped = 0
    while True:
        frames = sock.recv_multipart(copy=True)
        ident, signed = frames[0], frames[1:]
        body = auth.verify(key, signed)
        if body is None:  # not from a holder of the key: never decoded, never answered
            dropped += 1
            if dropped <= 10 or dropped % 1000 == 0:
                log.warning("dropped a request without a valid MAC (%d so far)", dropped)
            continue
        try:
            request_id, request = p.decode(body)
        except p.ProtocolError as e:
            text = str(e)
            if text.startswith("unknown message type"):
                text = "unknown RPC" + text.removeprefix("unknown message type")
            reply: object = p.AckReply("invalid", text)
            request_id, request = 0, None
        else:
            if isinstance(request, p.ShutdownRequest):
                engine.group.publish(group.Stop())
                sock.send_multipart([ident, *p.encode(p.AckReply(), request_id)])
                break
            try:
                reply = group.call(engine, request)
            except Exception as e:  # a bug of the engine's own: answer instead of dying
                log.exception("engine error on %s", type(request).__name__)
                reply = p.failure(request, "error", f"engine error: {e!r}")
        try:
            sock.send_multipart([ident, *p.encode(reply, request_id)])
        except p.ProtocolError as e:
            sock.send_multipart([ident, *p.encode(p.failure(request, "error", str(e)), request_id)])
    sock.close()
    ctx.term()
    return 0


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        sys.stderr.write("usage: python -m athanor.engine.worker CONFIG.json\n")
        return 2
    key = auth.read_key()  # first: nothing else may read the pipe
    logging.basicConfig(level=logging.INFO, format="%(asctime)s worker %(levelname)s %(name)s: %(message)s")
    config = EngineConfig.from_json(Path(args[0]).read_text())
    return serve(config, key)


if __name__ == "__main__":
    sys.exit(main())
