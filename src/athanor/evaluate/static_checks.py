"""Static checks of a candidate's source: what it may import and what it must not do.

The first stage of the cascade, and the cheapest: nothing runs. The rules are an allowlist of
imports (compute only: torch, triton, math, athanor.model, athanor.kernels, ...) and a short
list of forbidden constructs:

- threads and processes (`threading`, `multiprocessing`, `concurrent`, ...): work that runs
  beside the timed step is not timed;
- extra CUDA streams without a synchronisation back to the engine's stream: work left on a
  side stream escapes the timing events;
- file system and network access (`open`, `socket`, `os`, `pathlib`, `torch.load`, ...): a
  candidate must not read stored outputs (the reference's, or its own from an earlier run);
- introspection that reaches other objects of the process (`gc`, `inspect`, `sys._getframe`,
  `ctypes`, `eval`, `exec`, `__import__`, `globals()`): the way to read the reference's or
  the evaluator's state;
- rebinding attributes of imported modules or classes (`torch.allclose = ...`,
  `time.perf_counter = ...`, `setattr(F, ...)`): monkeypatching timing or comparison functions.

The worker's sandbox and the runtime probes back these up; a static rule is a fast, explainable
first line, not the wall.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass

ALLOWED_IMPORTS = (
    "__future__", "torch", "triton", "math", "functools", "itertools", "operator", "dataclasses", "typing",
    "collections", "enum", "abc", "numbers", "athanor.model", "athanor.kernels", "numpy",
)
"""Modules (and their submodules) a candidate may import."""

FORBIDDEN_IMPORT_PARTS = ("torch.multiprocessing", "torch.distributed.rpc", "torch.hub", "torch.utils.data",
                          "torch.testing", "numpy.lib.npyio", "athanor.model.registry", "athanor.model.cache",
                          "athanor.model.hf", "athanor.model.gguf_loader", "athanor.model.tokenizer")
"""Allowed trees' submodules that still reach files, processes or the network."""

FORBIDDEN_CALLS = {
    "open": "file access", "eval": "dynamic code", "exec": "dynamic code", "compile": "dynamic code",
    "__import__": "dynamic import", "globals": "introspection", "vars": "introspection",
    "setattr": "attribute patching", "delattr": "attribute patching", "breakpoint": "debugger",
    "input": "reading stdin",
}
FORBIDDEN_ATTRS = {
    "load": "loading stored data (torch.load / numpy.load)", "save": "writing files", "from_file": "file access",
    "fromfile": "file access", "tofile": "file access", "_getframe": "introspection of other frames",
    "f_back": "introspection of other frames", "f_locals": "introspection of other frames",
    "f_globals": "introspection of other frames", "gi_frame": "introspection", "__globals__": "introspection",
    "__subclasses__": "introspection", "__code__": "code patching", "__dict__": "namespace access",
    "elapsed_time": "reading timing events", "perf_counter": "reading the clock", "register_forward_hook": "hooks",
    "set_num_threads": "changing the thread pool", "set_num_interop_threads": "changing the thread pool",
}
STREAM_MAKERS = ("Stream", "stream", "ExternalStream")
STREAM_SYNCS = ("wait_stream", "wait_event", "synchronize")


@dataclass(frozen=True)
class Finding:
    line: int
    message: str

    def __str__(self) -> str:
        return f"line {self.line}: {self.message}"


def _allowed(module: str) -> bool:
    if any(module == f or module.startswith(f + ".") for f in FORBIDDEN_IMPORT_PARTS):
        return False
    return any(module == a or module.startswith(a + ".") for a in ALLOWED_IMPORTS)


def _root(node: ast.expr) -> str | None:
    while isinstance(node, (ast.Attribute, ast.Subscript)):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


class _Checker(ast.NodeVisitor):
    def __init__(self) -> None:
        self.findings: list[Finding] = []
        self.imported: dict[str, str] = {}  # local name -> module (or module.attr)
        self.streams: list[int] = []
        self.syncs = 0

    def flag(self, node: ast.AST, message: str) -> None:
        self.findings.append(Finding(getattr(node, "lineno", 0), message))

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            if not _allowed(alias.name):
                self.flag(node, f"imports {alias.name}, which is not on the allowlist (static_checks.ALLOWED_IMPORTS)")
            self.imported[alias.asname or alias.name.split(".")[0]] = alias.name
        self.generic_visit(node)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        module = "." * node.level + (node.module or "")
        if node.level or not _allowed(module):
            self.flag(node, f"imports from {module or '.'}, which is not on the allowlist (static_checks.ALLOWED_IMPORTS)")
        for alias in node.names:
            full = f"{module}.{alias.name}"
            if not node.level and not _allowed(full) and _allowed(module) and full in FORBIDDEN_IMPORT_PARTS:
                self.flag(node, f"imports {full}")
            self.imported[alias.asname or alias.name] = full
        self.generic_visit(node)

    def _check_target(self, target: ast.expr) -> None:
        if isinstance(target, (ast.Tuple, ast.List)):
            for t in target.elts:
                self._check_target(t)
            return
        if isinstance(target, ast.Attribute):
            root = _root(target)
            if root in self.imported or root in ("builtins", "__builtins__"):
                self.flag(target, f"rebinds {ast.unparse(target)} (patching an imported module or class)")

    def visit_Assign(self, node: ast.Assign) -> None:
        for target in node.targets:
            self._check_target(target)
        self.generic_visit(node)

    def visit_AugAssign(self, node: ast.AugAssign) -> None:
        self._check_target(node.target)
        self.generic_visit(node)

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        self._check_target(node.target)
        self.generic_visit(node)

    def visit_Delete(self, node: ast.Delete) -> None:
        for target in node.targets:
            self._check_target(target)
        self.generic_visit(node)

    def visit_Global(self, node: ast.Global) -> None:
        self.flag(node, "uses `global` (module state shared across calls)")

    def visit_Call(self, node: ast.Call) -> None:
        fn = node.func
        if isinstance(fn, ast.Name) and fn.id in FORBIDDEN_CALLS and fn.id not in self.imported:
            self.flag(node, f"calls {fn.id}() ({FORBIDDEN_CALLS[fn.id]})")
        name = fn.attr if isinstance(fn, ast.Attribute) else fn.id if isinstance(fn, ast.Name) else ""
        if name in STREAM_MAKERS:
            self.streams.append(node.lineno)
        if name in STREAM_SYNCS:
            self.syncs += 1
        self.generic_visit(node)

    def visit_Attribute(self, node: ast.Attribute) -> None:
        if node.attr in FORBIDDEN_ATTRS:
            self.flag(node, f"uses .{node.attr} ({FORBIDDEN_ATTRS[node.attr]})")
        self.generic_visit(node)

    def visit_Name(self, node: ast.Name) -> None:
        if node.id in ("__builtins__", "__loader__", "__spec__"):
            self.flag(node, f"uses {node.id} (introspection)")
        self.generic_visit(node)


def check_source(source: str) -> list[Finding]:
    """Every rule the source breaks (empty: it passes). A syntax error is one finding."""
    try:
        tree = ast.parse(source)
    except SyntaxError as e:
        return [Finding(e.lineno or 0, f"does not parse: {e.msg}")]
    checker = _Checker()
    checker.visit(tree)
    if checker.streams and not checker.syncs:
        checker.findings.append(Finding(checker.streams[0], "creates a CUDA stream but never synchronises it "
                                                            "with the engine's (wait_stream / wait_event)"))
    return sorted(checker.findings, key=lambda f: f.line)
