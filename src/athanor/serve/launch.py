"""`ServerProcess`: run `athanor serve` as a child process on a free local port (tests, benchmarks, scripts)."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

from athanor.errors import EngineDied


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


class ServerProcess:
    """`athanor serve ARGS` on 127.0.0.1 and a free port; `url` once `start` returned."""

    def __init__(self, args: list[str], log_path: str | Path, host: str = "127.0.0.1") -> None:
        self.host = host
        self.port = free_port(host)
        self.args = [*args, "--host", host, "--port", str(self.port)]
        self.log_path = Path(log_path)
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self, timeout_s: float = 180.0) -> ServerProcess:
        with open(self.log_path, "ab") as out:
            self._proc = subprocess.Popen([sys.executable, "-m", "athanor", "serve", *self.args],
                                          stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                          start_new_session=True)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise EngineDied(f"athanor serve exited with {self._proc.returncode}: {self.log_tail()}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{self.url}/health", timeout=2).status_code == 200:
                    return self
            time.sleep(0.3)
        self.stop()
        raise EngineDied(f"athanor serve did not come up within {timeout_s:g}s: {self.log_tail()}")

    def log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()

    def __enter__(self) -> ServerProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
