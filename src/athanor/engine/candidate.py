"""`Candidate`: one forward-pass source file plus its manifest, and how the worker imports it.

A candidate's source is written to its own scratch directory and imported under a unique
module name, so `inspect.getsource` (which `@triton.jit` needs) finds the file, and two
candidates never share module state. Dropping a candidate removes its module again.
"""

from __future__ import annotations

import contextlib
import gc
import hashlib
import importlib.util
import linecache
import sys
import traceback
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

from athanor.errors import CandidateError
from athanor.seams import seam_mismatch

MODULE_PREFIX = "athanor_candidate_"


@dataclass(frozen=True)
class CandidateManifest:
    """Who made a candidate and from what; `content_hash` identifies the source."""

    content_hash: str
    """sha256 of the source text (hex)."""
    parent: str = ""
    """Content hash (or id) of the candidate this one was derived from; empty for a baseline."""
    author: str = ""
    """The agent or person that wrote it."""
    description: str = ""


@dataclass(frozen=True)
class Candidate:
    """A candidate forward pass: a Python source defining `build(model, ctx) -> Forward`."""

    source: str
    manifest: CandidateManifest

    @property
    def id(self) -> str:
        """A short, stable name: the first 16 hex digits of the content hash."""
        return self.manifest.content_hash[:16]

    @classmethod
    def from_source(cls, source: str, *, parent: str = "", author: str = "", description: str = "") -> Candidate:
        manifest = CandidateManifest(content_hash(source), parent, author, description)
        return cls(source, manifest)

    @classmethod
    def from_file(cls, path: str | Path, *, parent: str = "", author: str = "", description: str = "") -> Candidate:
        path = Path(path)
        try:
            source = path.read_text()
        except OSError as e:
            raise CandidateError(f"{path}: cannot read the candidate ({e.strerror})") from None
        return cls.from_source(source, parent=parent, author=author, description=description or path.name)

    def check_hash(self) -> None:
        """Raise CandidateError when the manifest's hash does not match the source."""
        if content_hash(self.source) != self.manifest.content_hash:
            raise CandidateError(f"candidate {self.id}: the manifest's content hash does not match its source")


def content_hash(source: str) -> str:
    return hashlib.sha256(source.encode()).hexdigest()


def reference_source() -> str:
    """The reference forward's source text (the baseline candidate)."""
    from athanor.model import reference

    assert reference.__file__ is not None
    return Path(reference.__file__).read_text()


def baseline_candidate() -> Candidate:
    """The reference forward as a candidate."""
    return Candidate.from_source(reference_source(), author="athanor", description="reference forward (baseline)")


def format_exception(e: BaseException, limit: int = 30) -> str:
    """The traceback of `e`, trimmed to its last `limit` lines (the candidate's frames are last)."""
    lines = "".join(traceback.format_exception(type(e), e, e.__traceback__)).rstrip().splitlines()
    return "\n".join(lines[-limit:])


def import_candidate(candidate: Candidate, scratch_dir: Path, serial: int) -> ModuleType:
    """Write the source to `scratch_dir/candidate.py` and import it under a unique module name.

    Raises CandidateError with the error text when the source does not compile or its
    top-level code raises; the half-imported module is removed again.
    """
    scratch_dir.mkdir(parents=True, exist_ok=True)
    path = scratch_dir / "candidate.py"
    path.write_text(candidate.source)
    try:
        compile(candidate.source, str(path), "exec")
    except SyntaxError as e:
        raise CandidateError(f"candidate {candidate.id}: line {e.lineno}: {e.msg} (the source does not parse)") from None
    except ValueError as e:  # null bytes
        raise CandidateError(f"candidate {candidate.id}: {e}") from None
    if mismatch := seam_mismatch(candidate.source, f"candidate {candidate.id}"):
        raise CandidateError(mismatch)
    name = f"{MODULE_PREFIX}{candidate.id}_{serial}"
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    # Registered before executing, as a normal import does: dataclasses and @triton.jit look the
    # module up by name while the file runs.
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException as e:
        unload_module(name)
        if isinstance(e, KeyboardInterrupt):
            raise
        raise CandidateError(f"candidate {candidate.id}: importing it raised\n{format_exception(e)}") from None
    return module


def unload_module(name: str) -> None:
    """Forget a candidate module (and any submodule it registered under its name)."""
    for key in [k for k in sys.modules if k == name or k.startswith(name + ".")]:
        del sys.modules[key]
    linecache.clearcache()
    importlib.invalidate_caches()


@contextlib.contextmanager
def collector_off() -> Iterator[None]:
    """The garbage collector off while candidate steps run (a collection inside a timed step is noise)."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def candidate_failure(e: Exception, candidate_id: str) -> str:
    """The error line of a run that candidate code broke; exits the worker when the device is beyond repair."""
    from athanor.engine.core import exit_if_device_broken

    exit_if_device_broken(e)
    return f"candidate {candidate_id}: {format_exception(e)}"
