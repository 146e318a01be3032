"""Resolve a model name or path to a `Model` (and its tokenizer).

Accepted forms:
- `smollm2-135m`: the embedded default model (real weights, from the user cache);
- a preset name (`llama-3.2-1b`, `tiny-moe`, ...) or `random:PRESET[@SEED]`: random weights;
- a path to an HF model directory or to a `.gguf` file.

The embedded model is read from its GGUF once and kept as an HF directory of its exact
dequantized fp32 values beside it, because parsing GGUF metadata and dequantizing costs
seconds on every start, while safetensors are memory-mapped.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import shutil
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from athanor.errors import ConfigError, ModelLoadError
from athanor.model import cache
from athanor.model.gguf_loader import read_gguf
from athanor.model.hf import read_hf_dir, save_hf
from athanor.model.hf_config import read_config
from athanor.model.model import Model
from athanor.model.presets import PRESETS
from athanor.model.random_init import random_model
from athanor.model.spec import ModelSpec
from athanor.model.tokenizer import Tokenizer

log = logging.getLogger(__name__)

DEFAULT_MODEL = "smollm2-135m"
_CONVERTED_FORMAT = 1


@dataclass(frozen=True)
class ModelEntry:
    """One row of `athanor models`."""

    name: str
    kind: str
    params: int
    cached: str


def _converted_dir() -> Path:
    return cache.cache_dir() / "models" / "smollm2-135m-hf"


def _load_default(device: torch.device | str, dtype: torch.dtype | None) -> tuple[Model, Tokenizer]:
    converted = _converted_dir()
    marker = converted / "athanor.json"
    if marker.is_file():
        try:
            ok = json.loads(marker.read_text()).get("format") == _CONVERTED_FORMAT
        except json.JSONDecodeError:
            ok = False
        if ok:
            model, tokenizer = read_hf_dir(converted, dtype=dtype, device=device)
            assert tokenizer is not None
            return _named(model, DEFAULT_MODEL), tokenizer
    gguf_path = cache.fetch_smollm2()
    model, tokenizer = read_gguf(gguf_path)
    model = _named(model, DEFAULT_MODEL)
    _write_converted(model, tokenizer, converted)
    return model.to(device=device, dtype=dtype), tokenizer


def _write_converted(model: Model, tokenizer: Tokenizer, converted: Path) -> None:
    tmp = converted.with_name(converted.name + f".tmp{os.getpid()}")
    try:
        save_hf(model, tmp, tokenizer=tokenizer)
        (tmp / "athanor.json").write_text(json.dumps({"format": _CONVERTED_FORMAT, "source": model.source}) + "\n")
        shutil.rmtree(converted, ignore_errors=True)
        tmp.rename(converted)
    except OSError as e:  # a read-only cache only costs speed
        log.warning("could not keep a converted copy of %s in %s (%s)", DEFAULT_MODEL, converted, e)
        shutil.rmtree(tmp, ignore_errors=True)


def _named(model: Model, name: str) -> Model:
    return Model(replace(model.spec, name=name), model.weights, model.source, model.full_num_layers)


def load_model_and_tokenizer(
    name_or_path: str, device: torch.device | str = "cpu", dtype: torch.dtype | None = None, seed: int = 0
) -> tuple[Model, Tokenizer | None]:
    """The model named or found at `name_or_path`, on `device` in `dtype` (default: as stored, fp32 for random)."""
    if name_or_path == DEFAULT_MODEL:
        return _load_default(device, dtype)
    preset, _, seed_text = name_or_path.removeprefix("random:").partition("@")
    if preset in PRESETS and (name_or_path.startswith("random:") or preset != DEFAULT_MODEL):
        if seed_text:
            try:
                seed = int(seed_text)
            except ValueError:
                raise ConfigError(f"--model {name_or_path}: the seed after '@' must be an integer") from None
        return random_model(PRESETS[preset], seed=seed, device=device, dtype=dtype or torch.float32), None
    path = Path(name_or_path).expanduser()
    if path.is_dir():
        return read_hf_dir(path, dtype=dtype, device=device)
    if path.suffix == ".gguf" and path.is_file():
        model, tokenizer = read_gguf(path, dtype=dtype or torch.float32)
        return model.to(device=device), tokenizer
    if path.exists():
        raise ModelLoadError(f"{path}: neither an HF model directory nor a .gguf file")
    if "/" in name_or_path or path.suffix:
        raise ModelLoadError(f"--model {name_or_path}: no such file or directory")
    known = ", ".join(sorted(PRESETS))
    raise ConfigError(
        f"unknown model {name_or_path!r}: use {DEFAULT_MODEL}, a preset ({known}), "
        "random:PRESET[@SEED], an HF model directory or a .gguf file"
    )


def load_model(name_or_path: str, device: torch.device | str = "cpu", dtype: torch.dtype | None = None,
               seed: int = 0) -> Model:
    """The model only (see `load_model_and_tokenizer`)."""
    return load_model_and_tokenizer(name_or_path, device, dtype, seed)[0]


def preset_of(name_or_path: str) -> str | None:
    """The preset a name with random weights refers to (`tiny-dense`, `random:llama-3.2-1b@3`), else None."""
    preset = name_or_path.removeprefix("random:").partition("@")[0]
    if preset not in PRESETS or (preset == DEFAULT_MODEL and not name_or_path.startswith("random:")):
        return None
    return preset


@functools.lru_cache(maxsize=16)
def load_spec(name_or_path: str) -> ModelSpec:
    """The spec of a model without loading its weights where the format allows (presets, HF directories);
    remembered, since the evaluator, the loop and the CLI all ask for it."""
    preset = preset_of(name_or_path)
    if preset is not None or name_or_path == DEFAULT_MODEL:
        return PRESETS[preset or DEFAULT_MODEL]
    path = Path(name_or_path).expanduser()
    if path.is_dir():
        return read_config(path)[0]
    return load_model(name_or_path).spec


def load_tokenizer(name_or_path: str = DEFAULT_MODEL) -> Tokenizer:
    """The tokenizer of a model that has one (the default model, GGUF files, HF directories with tokenizer.json)."""
    if name_or_path == DEFAULT_MODEL:
        marker = _converted_dir() / "tokenizer.json"
        if marker.is_file():
            from athanor.model.tokenizer import tokenizer_from_hf_dir

            tokenizer = tokenizer_from_hf_dir(marker.parent)
            if tokenizer is not None:
                return tokenizer
    # A random preset has no tokenizer: say so without building its weights (GBs for the large ones).
    tokenizer = None if preset_of(name_or_path) else load_model_and_tokenizer(name_or_path)[1]
    if tokenizer is None:
        raise ConfigError(f"--model {name_or_path}: has no tokenizer (random presets have none); "
                          f"use {DEFAULT_MODEL}, a .gguf file or an HF directory with tokenizer.json")
    return tokenizer


def list_models() -> list[ModelEntry]:
    """Every preset, and whether the embedded default is cached."""
    rows = []
    for name, spec in sorted(PRESETS.items()):
        if name == DEFAULT_MODEL:
            where = str(_converted_dir()) if (_converted_dir() / "athanor.json").is_file() else (
                str(cache.smollm2_path()) if cache.is_smollm2_cached() else "not cached (fetched on first use)")
            rows.append(ModelEntry(name, "embedded (real weights)", spec.num_params(), where))
        else:
            rows.append(ModelEntry(name, "preset (random weights)", spec.num_params(), "-"))
    return rows
