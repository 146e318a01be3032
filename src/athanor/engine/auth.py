"""Authenticated requests: every frame a worker acts on carries an HMAC-SHA256 under its own key.

A worker's socket is a pathname unix socket: neither its network namespace nor Landlock's rights
keep another process (a candidate in another worker) from connecting to it. So the socket is not
the credential; a per-worker random key is. The process that starts a worker creates the key
(`new_key`), writes it into a pipe on the worker's stdin and keeps it for its own clients; the
worker reads it (`read_key`) before anything else runs and drops every request whose MAC does not
verify before decoding a byte of it. The key is never in argv, the environment or a file, which
any root process could read.

Frames on the wire: `[mac, *message_frames]`; the MAC covers each message frame with its length,
so frames cannot be split or joined differently under one MAC.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import subprocess
from collections.abc import Sequence
from contextlib import suppress
from typing import Any

KEY_BYTES = 32
MAC_BYTES = hashlib.sha256().digest_size
REPORT = "requests: authenticated (HMAC-SHA256 under a per-worker key from stdin; others dropped unread)"


def new_key() -> bytes:
    return secrets.token_bytes(KEY_BYTES)


def mac(key: bytes, frames: Sequence[Any]) -> bytes:
    """HMAC-SHA256 of `frames` (bytes-like or zmq Frames), each prefixed by its length."""
    h = hmac.new(key, digestmod=hashlib.sha256)
    for frame in frames:
        view = memoryview(getattr(frame, "buffer", frame))
        h.update(view.nbytes.to_bytes(8, "little"))
        h.update(view)
    return h.digest()


def sign(key: bytes, frames: Sequence[Any]) -> list[Any]:
    """`frames` with their MAC in front, ready to send."""
    return [mac(key, frames), *frames]


def verify(key: bytes, frames: Sequence[Any]) -> list[Any] | None:
    """The message frames of a signed message, or None when its MAC does not verify."""
    if len(frames) < 2:
        return None
    tag = bytes(getattr(frames[0], "bytes", frames[0]))
    if len(tag) != MAC_BYTES or not hmac.compare_digest(tag, mac(key, frames[1:])):
        return None
    return list(frames[1:])


def read_key(fd: int = 0) -> bytes:
    """The worker's key from the pipe on `fd` (stdin); the fd is then pointed at /dev/null.

    Raises SystemExit when no whole key arrives: a worker without a key could only refuse everything."""
    key = b""
    while len(key) < KEY_BYTES:
        chunk = os.read(fd, KEY_BYTES - len(key))
        if not chunk:
            break
        key += chunk
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, fd)
    os.close(null)
    if len(key) != KEY_BYTES:
        raise SystemExit(f"no request key on stdin ({len(key)} of {KEY_BYTES} bytes): start workers through "
                         "their Supervisor or WorkerHandle")
    return key


def give_key(proc: subprocess.Popen[bytes], key: bytes) -> None:
    """Write `key` into the pipe on the new worker's stdin and close it (a worker that already died has
    closed its end)."""
    assert proc.stdin is not None
    with suppress(BrokenPipeError):
        proc.stdin.write(key)
    with suppress(BrokenPipeError):
        proc.stdin.close()
