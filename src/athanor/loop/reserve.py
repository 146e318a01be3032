"""How much of a compile budget to keep for confirming on the slow tier: what confirming cost on this machine.

A run's first confirmation costs the slow tier's engine start plus one whole-model evaluation: ~83 s for
llama-3.1-8b on an H200 (a 35 s start, then 45-56 s), ~225 s for smollm2 on a 2-core CPU. A constant reserve
either spends screening time on nothing (120 s held for the 8B's ~83 s: three screens fewer of the ~45 an
8-minute budget holds) or lets the confirmation run past the budget. So each run records what its first
confirmation cost, engines started included, per model, device, dtype and depth, in the machine's cache
directory (beside the compiler caches: what this machine has measured), and later runs keep `MARGIN` times the
median of the last `HISTORY` of them. A machine with no record keeps the device's default.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from athanor.errors import ConfigError
from athanor.model.cache import cache_dir

if TYPE_CHECKING:
    from athanor.loop.config import CompileConfig

log = logging.getLogger(__name__)

HISTORY = 5
"""Confirmations kept per key (the newest): enough for a median that one slow outlier does not move."""
MARGIN = 1.15
"""The reserve over the median: the 8B's confirmations on one H200 ranged 45-56 s around a 47.5 s median."""
FILE = "confirmations.json"


def reserve_from(walls: Sequence[float]) -> float | None:
    """Seconds to keep for one confirmation, given what earlier ones cost (None: no record)."""
    return MARGIN * statistics.median(walls) if walls else None


def confirmation_key(model: str, device: str, dtype: str, layers: int) -> str:
    """What a confirmation's cost depends on: the model and depth the slow tier runs, its dtype, and the hardware
    (the GPU's name, not its index: two H200s of one host cost the same)."""
    hardware = device
    if device.startswith("cuda"):
        import torch

        hardware = torch.cuda.get_device_name(torch.device(device))
    return f"{model}|{hardware}|{dtype or 'stored'}|{layers}"


def _path() -> Path:
    return cache_dir() / FILE


def _load() -> dict[str, list[float]]:
    try:
        data = json.loads(_path().read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def measured_reserve(key: str) -> float | None:
    """The reserve this machine's record of `key` asks for (None: none recorded)."""
    walls = [float(w) for w in _load().get(key, []) if isinstance(w, int | float)]
    return reserve_from(walls[-HISTORY:])


def record_confirmation(key: str, seconds: float) -> None:
    """Add a first confirmation's wall time to the record (best effort: a read-only cache only loses the record)."""
    data = _load()
    data[key] = [*data.get(key, []), round(seconds, 2)][-HISTORY:]
    try:
        _path().parent.mkdir(parents=True, exist_ok=True)
        tmp = _path().with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(data, indent=1) + "\n")
        tmp.replace(_path())  # whole or not at all: a concurrent run reads the old record, never half a file
    except OSError as e:
        log.warning("could not record the confirmation's cost in %s: %s", _path(), e)


def stretched_budget(config: CompileConfig) -> CompileConfig:
    """`config` with its budget raised, in whole minutes, to the smallest that confirms one candidate and still
    searches where this machine's record says its budget cannot (`check_budget` would refuse it); else unchanged."""
    measured = measured_reserve(config.confirmation_key)
    if not measured or config.confirm_reserve_s or config.budget_s >= config.smallest_budget_s(measured):
        return config
    return dataclasses.replace(config, budget_s=60.0 * math.ceil(config.smallest_budget_s(measured) / 60))


def check_budget(config: CompileConfig) -> None:
    """A ConfigError, before anything is started or written, where this machine's record says the budget cannot
    confirm one candidate and still search (`CompileConfig.smallest_budget_s`)."""
    measured = measured_reserve(config.confirmation_key)
    if not measured or config.confirm_reserve_s or config.budget_s >= config.smallest_budget_s(measured):
        return
    smallest = math.ceil(config.smallest_budget_s(measured) / 60)
    raise ConfigError(f"--budget {config.budget_s:.0f}s: confirming one candidate of {config.model} on this "
                      f"machine takes about {measured:.0f} s (its last confirmations), which leaves the search too "
                      f"little; the smallest workable budget here is {smallest}m")
