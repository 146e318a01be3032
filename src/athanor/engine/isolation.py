"""Undo what a candidate did to athanor's (and torch's) module namespaces.

A candidate runs in the engine's interpreter, so it can rebind `athanor.model.reference.rms_norm`,
`torch.nn.functional.linear` or a method of `Model`. `ModuleGuard` snapshots those namespaces
once, after the engine has imported what it needs, and `restore()` puts them back before each
new candidate is imported and after one is dropped: no edit survives a swap. Athanor modules
first imported by a candidate are forgotten, so the next import runs them afresh.
"""

from __future__ import annotations

import contextlib
import logging
import sys
from types import ModuleType
from typing import Any

log = logging.getLogger(__name__)

GUARDED_PREFIXES = ("athanor",)
"""Module trees whose every module (and the classes defined in them) is restored."""
GUARDED_MODULES = ("torch", "torch.nn.functional", "torch.nn.init", "math", "builtins")
"""Single modules restored too (namespaces only; too many torch submodules to guard all)."""
GUARDED_CLASSES = ("torch.Tensor",)
PICKLE_CACHES = frozenset({"__slotnames__"})
"""Class attributes pickle caches on a class the first time it pickles one of its instances (`copyreg`): not edits."""


def _is_guarded(name: str) -> bool:
    return any(name == p or name.startswith(p + ".") for p in GUARDED_PREFIXES)


def _resolve(path: str) -> Any:
    module, _, attr = path.rpartition(".")
    return getattr(sys.modules[module], attr)


class ModuleGuard:
    """Snapshot of module and class namespaces; `restore()` undoes edits since the snapshot."""

    def __init__(self) -> None:
        self._modules: dict[str, tuple[ModuleType, dict[str, Any]]] = {}
        self._classes: list[tuple[type, dict[str, Any]]] = []
        for name, module in list(sys.modules.items()):
            if module is None or not (_is_guarded(name) or name in GUARDED_MODULES):
                continue
            self._modules[name] = (module, dict(vars(module)))
            if _is_guarded(name):
                for value in list(vars(module).values()):
                    if isinstance(value, type) and value.__module__ == name:
                        self._classes.append((value, dict(vars(value))))
        for path in GUARDED_CLASSES:
            try:
                cls = _resolve(path)
            except (KeyError, AttributeError):
                continue
            self._classes.append((cls, dict(vars(cls))))

    def restore(self) -> list[str]:
        """Put every guarded namespace back; returns the names that had been changed."""
        changed: list[str] = []
        for name in [n for n in sys.modules if _is_guarded(n) and n not in self._modules]:
            del sys.modules[name]  # first imported by a candidate: re-run it next time
            changed.append(name)
        for name, (module, saved) in self._modules.items():
            if sys.modules.get(name) is not module:
                sys.modules[name] = module
                changed.append(name)
            current = vars(module)
            if _same(current, saved):
                continue
            changed.append(name)
            for key in [k for k in current if k not in saved]:
                value = current[key]
                # A submodule imported since the snapshot sets itself as an attribute of its
                # parent; it stays as long as the module itself stays imported.
                if isinstance(value, ModuleType) and sys.modules.get(value.__name__) is value:
                    continue
                del current[key]
            current.update(saved)
        for cls, saved in self._classes:
            current_cls = {k: v for k, v in vars(cls).items() if k not in PICKLE_CACHES}
            if _same(current_cls, saved):
                continue
            changed.append(f"{cls.__module__}.{cls.__qualname__}")
            for key in [k for k in current_cls if k not in saved]:
                _try(delattr, cls, key)
            for key, value in saved.items():
                if current_cls.get(key) is not value:
                    _try(setattr, cls, key, value)
        if changed:
            log.info("restored namespaces a candidate had changed: %s", ", ".join(sorted(set(changed))[:10]))
        return changed


def _same(current: dict[str, Any], saved: dict[str, Any]) -> bool:
    if current.keys() != saved.keys():
        return False
    return all(current[k] is v for k, v in saved.items())


def _try(fn: Any, *args: Any) -> None:
    with contextlib.suppress(AttributeError, TypeError):  # read-only slots of builtin types
        fn(*args)
