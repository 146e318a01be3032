"""A deployable candidate directory: `candidate.py` plus `manifest.json` (docs/architecture.md).

The compile loop writes its winner as one and the server loads one to serve or deploy; the format
lives beside `Candidate`, which both already depend on, so neither reaches into the other.

`manifest.json` holds the fields of `CandidateManifest` (content_hash, parent, author, description);
other keys (verification and benchmark records) are kept by whoever wrote them and ignored here.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from athanor.engine.candidate import Candidate, CandidateManifest, content_hash
from athanor.errors import ConfigError
from athanor.seams import seam_mismatch

SOURCE_NAME = "candidate.py"
MANIFEST_NAME = "manifest.json"


def load_candidate_dir(directory: str | Path) -> Candidate:
    """The candidate in `directory`; ConfigError naming the file when it is missing or inconsistent."""
    d = Path(directory).expanduser()
    source_path, manifest_path = d / SOURCE_NAME, d / MANIFEST_NAME
    if not d.is_dir():
        raise ConfigError(f"{d}: not a directory; a candidate directory holds {SOURCE_NAME} and {MANIFEST_NAME}")
    if not source_path.is_file():
        raise ConfigError(f"{source_path}: missing; a candidate directory holds the forward pass in {SOURCE_NAME}")
    source = source_path.read_text()
    if mismatch := seam_mismatch(source, str(source_path)):
        raise ConfigError(mismatch)
    raw: dict[str, Any] = {}
    if manifest_path.is_file():
        try:
            raw = json.loads(manifest_path.read_text())
        except json.JSONDecodeError as e:
            raise ConfigError(f"{manifest_path}: not valid JSON ({e.msg} at line {e.lineno})") from None
        if not isinstance(raw, dict):
            raise ConfigError(f"{manifest_path}: expected a JSON object")
    digest = content_hash(source)
    declared = str(raw.get("content_hash") or digest)
    if declared != digest:
        raise ConfigError(f"{manifest_path}: content_hash {declared[:16]}... does not match {SOURCE_NAME} "
                          f"({digest[:16]}...); the source was edited after the manifest was written")
    manifest = CandidateManifest(digest, str(raw.get("parent", "")), str(raw.get("author", "")),
                                 str(raw.get("description", "")) or d.name)
    return Candidate(source, manifest)


def write_candidate_dir(candidate: Candidate, directory: str | Path, **extra: Any) -> Path:
    """Write `candidate` as a deployable directory (`extra` goes into the manifest beside its fields)."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    (d / SOURCE_NAME).write_text(candidate.source)
    m = candidate.manifest
    manifest = {"content_hash": m.content_hash, "parent": m.parent, "author": m.author,
                "description": m.description, **extra}
    (d / MANIFEST_NAME).write_text(json.dumps(manifest, indent=2) + "\n")
    return d
