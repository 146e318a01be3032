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

from athanor.engine import auth
from athanor.engine.config import EngineConfig
from athanor.engine.credentials import drop_credentials
from athanor.engine.namespaces import launch_info, private_mounts
from athanor.engine.sandbox import default_writable, enter_sandbox

if TYPE_CHECKING:
    from athanor.engine.core import Engine
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


def _load_model(config: EngineConfig) -> Model:
    import torch

    from athanor.model.registry import load_model

    dtype = getattr(torch, config.dtype) if config.dtype else None
    model = load_model(config.model, device=config.device, dtype=dtype, seed=config.seed)
    if config.num_layers:
        model = model.slice(config.num_layers)
    return model


def boot(config: EngineConfig, transport: str = "") -> Engine:
    """Enter the sandbox, load the model once and return the sealed `Engine` (no socket yet).

    The engine's RPC loop (`serve`) and the serving loop (`athanor.serve.worker`) both start here;
    `transport` is their report line on how requests are authenticated.
    """
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
    report = ([transport] if transport else []) + lines + list(enter_sandbox(config.sandbox, writable))
    if config.sandbox.enabled:
        report.append(drop_credentials())  # last: the namespaces, mounts and Landlock above need capabilities
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
    if config.cpu_threads:
        torch.set_num_threads(config.cpu_threads)
    elif config.device == "cpu":
        torch.set_num_threads(max(1, len(os.sched_getaffinity(0)) - 1))
    t0 = time.perf_counter()
    model = _load_model(config)
    log.info("loaded %s on %s in %.2fs", config.model, config.device, time.perf_counter() - t0)
    engine = Engine(config, model, tuple(report))
    _rebind_like_dynamo(torch)
    engine.seal([str(w) for w in writable])
    torch.set_grad_enabled(False)  # an inference engine: no autograd state on any candidate's tensors
    return engine


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
                sock.send_multipart([ident, *p.encode(p.AckReply(), request_id)])
                break
            try:
                reply = engine.handle(request)
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
