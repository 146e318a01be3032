"""What a candidate file declares to the engine before it is imported: the seam version it follows and the parallel
layout it runs in. Torch-free, so the CLI and the engine's client can refuse a candidate of another seam, and start
the ranks a layout needs, before anything heavy is imported."""

from __future__ import annotations

import ast

from athanor.engine.config import LAYOUT_KEYS, parse_layout
from athanor.errors import ConfigError

SEAM_VERSION = 2
"""The seam this athanor builds: 2 is the paged KV pool (`BuildContext.block_table`). A candidate file declares the
version it follows as a module-level `SEAM_VERSION = 2`; one without it follows seam 1 (a KV cache per slot)."""


def pages_for(num_tokens: int, page_size: int) -> int:
    """KV pages that hold `num_tokens` tokens."""
    return -(-num_tokens // page_size)


def _constants(source: str) -> dict[str, object] | None:
    """What the module-level `NAME = <constant>` assignments of `source` assign, by name (None: a source that does
    not parse; the import reports the syntax error itself, with its line)."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return None
    return {t.id: node.value.value for node in tree.body if isinstance(node, ast.Assign)
            and isinstance(node.value, ast.Constant) for t in node.targets if isinstance(t, ast.Name)}


def declared_seam(source: str) -> int:
    """The seam version a candidate's source declares (a module-level `SEAM_VERSION = <int>`); 1 when it declares
    none (files from before the seam had a version)."""
    constants = _constants(source)
    if constants is None:
        return SEAM_VERSION
    version = constants.get("SEAM_VERSION")
    return version if isinstance(version, int) and not isinstance(version, bool) else 1


def declared_layout(source: str, what: str = "the candidate") -> dict[str, int] | None:
    """The parallel layout a candidate's source declares (a module-level `LAYOUT = "tp2"`, in `athanor plan`'s
    names or `tp=2,ep=2`) as degrees over 1 by key; None when it declares none, so runs in whatever layout its
    engine was started with. A ConfigError naming `what` for a declaration that is not a layout."""
    layout = (_constants(source) or {}).get("LAYOUT")
    if layout is None:
        return None
    if not isinstance(layout, str):
        raise ConfigError(f"{what}: LAYOUT = {layout!r} is not a layout; write e.g. LAYOUT = \"tp2\"")
    return parse_layout(layout, f"{what}: LAYOUT =")


def layout_name(degrees: dict[str, int]) -> str:
    """The degrees over 1 in `athanor plan`'s spelling (`tp2.ep2`), "tp1" for one device."""
    return ".".join(f"{k}{degrees[k]}" for k in LAYOUT_KEYS if degrees.get(k, 1) > 1) or "tp1"


def with_layout(source: str, degrees: dict[str, int]) -> str:
    """`source` declaring `degrees` as its layout: its `LAYOUT` line replaced, or one appended."""
    line = f'LAYOUT = "{layout_name(degrees)}"'
    lines = source.splitlines()
    for node in ast.parse(source).body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "LAYOUT" for t in node.targets):
            end = node.end_lineno or node.lineno
            return "\n".join([*lines[:node.lineno - 1], line, *lines[end:]]) + "\n"
    return source.rstrip("\n") + ("\n\n# The parallel layout this forward runs in: the engine starts a rank per device "
                                  f"of it.\n{line}\n")


def layout_mismatch(source: str, engine_layout: dict[str, int], what: str) -> str:
    """Why an engine started in `engine_layout` cannot build `what` (a candidate declaring another layout), or ""."""
    try:
        declared = declared_layout(source, what)
    except ConfigError as e:
        return str(e)
    running = {k: v for k, v in engine_layout.items() if v > 1}
    if declared is None or declared == running:
        return ""
    return (f"{what} declares LAYOUT = \"{layout_name(declared)}\"; this engine runs {layout_name(running)}: start one "
            f"in its layout (athanor serve --layout {','.join(f'{k}={v}' for k, v in declared.items()) or 'tp=1'})")


def seam_mismatch(source: str, what: str) -> str:
    """Why `what` (a candidate file, a winner directory) cannot be built here, or "" when its seam is this one."""
    version = declared_seam(source)
    if version == SEAM_VERSION:
        return ""
    return (f"{what} follows candidate seam {version}; this athanor builds seam {SEAM_VERSION} (a paged KV pool: "
            f"ctx.block_table, ctx.page_size, docs/architecture.md 'The candidate seam'): port it, or start again "
            f"from `athanor candidate new`")
