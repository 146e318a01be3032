"""The candidate seam's version, and reading the version a candidate file declares: torch-free, so the CLI and the
engine's client can refuse a candidate of another seam before anything heavy is imported."""

from __future__ import annotations

import ast

SEAM_VERSION = 2
"""The seam this athanor builds: 2 is the paged KV pool (`BuildContext.block_table`). A candidate file declares the
version it follows as a module-level `SEAM_VERSION = 2`; one without it follows seam 1 (a KV cache per slot)."""


def pages_for(num_tokens: int, page_size: int) -> int:
    """KV pages that hold `num_tokens` tokens."""
    return -(-num_tokens // page_size)


def declared_seam(source: str) -> int:
    """The seam version a candidate's source declares (a module-level `SEAM_VERSION = <int>`); 1 when it declares
    none (files from before the seam had a version)."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return SEAM_VERSION  # the import reports the syntax error itself, with its line
    for node in tree.body:
        if not isinstance(node, ast.Assign):
            continue
        declares = any(isinstance(t, ast.Name) and t.id == "SEAM_VERSION" for t in node.targets)
        if declares and isinstance(node.value, ast.Constant) and isinstance(node.value.value, int):
            return node.value.value
    return 1


def seam_mismatch(source: str, what: str) -> str:
    """Why `what` (a candidate file, a winner directory) cannot be built here, or "" when its seam is this one."""
    version = declared_seam(source)
    if version == SEAM_VERSION:
        return ""
    return (f"{what} follows candidate seam {version}; this athanor builds seam {SEAM_VERSION} (a paged KV pool: "
            f"ctx.block_table, ctx.page_size, docs/architecture.md 'The candidate seam'): port it, or start again "
            f"from `athanor candidate new`")
