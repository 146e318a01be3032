"""Rendering a template candidate with chosen options, and reading the options back.

A template is a package of pieces (`athanor.moves.templates.fast`): real modules, each one idea of the forward
pass (attention, the MoE block, the fused-GEMV decode path, ...), that import one another. A candidate is ONE
file, so `render` composes the pieces into one: the package's docstring, every piece's imports merged (their
imports of one another dropped: the names are the file's own), then each piece's body in the package's order.
The pieces' behaviour is selected by one dict literal between the markers `# --- OPTIONS` and
`# --- end OPTIONS ---`; `render` writes that block with the chosen values (validated against the `Move`s), so
the result is an ordinary candidate source that agents may keep editing and `read_options` can parse again.
"""

from __future__ import annotations

import ast
import functools
import importlib
import sys
import textwrap
from importlib import resources
from typing import Any

from athanor.errors import ConfigError
from athanor.moves.catalog import MOVES_BY_NAME, baseline_options

BEGIN = "# --- OPTIONS"
END = "# --- end OPTIONS ---"
TEMPLATES = ("fast",)
"""Template packages under athanor/moves/templates/ (one template covers dense and MoE models)."""
OWN_IMPORTS = "athanor.moves"
"""Imports from here are the pieces' imports of one another (or of the catalog): a rendered candidate has none."""
LINE_LENGTH = 110


def template_source(name: str = "fast") -> str:
    """The source text of template `name` at its baseline options: its pieces composed into one file."""
    return _substitute(compose(name), baseline_options())


@functools.cache
def compose(name: str) -> str:
    """Template `name`'s pieces in one file (its OPTIONS block still the pieces' own)."""
    if name not in TEMPLATES:
        raise ConfigError(f"unknown template {name!r}: use one of {', '.join(TEMPLATES)}")
    package = f"athanor.moves.templates.{name}"
    template = importlib.import_module(package)
    imports: list[ast.Import | ast.ImportFrom] = []
    sections = []
    for piece in template.PIECES:
        source = resources.files(package).joinpath(f"{piece}.py").read_text()
        doc, piece_imports, body = _split(f"{package}.{piece}", source)
        imports += piece_imports
        summary = " ".join(doc.split("\n\n")[0].split())
        header = f"# --- {piece} " + "-" * (LINE_LENGTH - 7 - len(piece))
        sections.append("\n".join([header, *textwrap.wrap(summary, LINE_LENGTH - 2, initial_indent="# ",
                                                          subsequent_indent="# "), body]))
    doc = ast.get_docstring(ast.parse(resources.files(package).joinpath("__init__.py").read_text())) or ""
    docstring = f'"""{doc}\n"""'
    return f"{docstring}\n\n{_merge_imports(imports)}\n\n" + "\n\n\n".join(sections) + "\n"


def _split(module: str, source: str) -> tuple[str, list[ast.Import | ast.ImportFrom], str]:
    """A piece's (docstring, imports, the code after them); a piece is exactly that, in that order."""
    tree = ast.parse(source)
    doc = ast.get_docstring(tree) or ""
    statements = tree.body[1:] if doc else tree.body
    imports: list[ast.Import | ast.ImportFrom] = []
    for node in statements:
        if not isinstance(node, ast.Import | ast.ImportFrom):
            break
        imports.append(node)
    if any(isinstance(node, ast.Import | ast.ImportFrom) for node in statements[len(imports):]):
        raise ConfigError(f"{module}: a template piece imports only at its top (its imports are merged)")
    end = imports[-1].end_lineno if imports else (tree.body[0].end_lineno if doc else 0)
    return doc, imports, "\n".join(source.splitlines()[end:]).strip("\n")


def _merge_imports(nodes: list[ast.Import | ast.ImportFrom]) -> str:
    """One import block for the pieces' imports, in ruff's isort order: __future__, the standard library, third
    parties, athanor; plain imports before from-imports, aliased names on lines of their own."""
    plain: set[tuple[str, str | None]] = set()
    names: dict[str, set[str]] = {}
    aliased: set[tuple[str, str, str]] = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            plain.update((a.name, a.asname) for a in node.names)
        elif node.module and node.module != "__future__" and not node.module.startswith(OWN_IMPORTS):
            for a in node.names:
                if a.asname:
                    aliased.add((node.module, a.name, a.asname))
                else:
                    names.setdefault(node.module, set()).add(a.name)
    sections: list[list[str]] = [[], [], []]
    for module, asname in sorted(plain):
        sections[_section(module)].append(f"import {module}" + (f" as {asname}" if asname else ""))
    froms = [(module, "", _from_line(module, sorted(names[module], key=_name_order))) for module in names]
    froms += [(module, name, f"from {module} import {name} as {asname}") for module, name, asname in aliased]
    for module, _, line in sorted(froms):
        sections[_section(module)].append(line)
    return "\n\n".join(["from __future__ import annotations", *("\n".join(s) for s in sections if s)])


def _section(module: str) -> int:
    top = module.split(".")[0]
    return 2 if top == "athanor" else 0 if top in sys.stdlib_module_names else 1


def _name_order(name: str) -> tuple[int, str]:
    """Constants, then classes, then the rest (ruff's order-by-type)."""
    return (0 if name.isupper() and len(name) > 1 else 1 if name[:1].isupper() else 2), name


def _from_line(module: str, names: list[str]) -> str:
    line = f"from {module} import {', '.join(names)}"
    if len(line) <= LINE_LENGTH:
        return line
    return f"from {module} import (\n" + "".join(f"    {name},\n" for name in names) + ")"


def _block(source: str) -> tuple[int, int]:
    begin = source.find(BEGIN)
    end = source.find(END, begin)
    if begin < 0 or end < 0:
        raise ConfigError(f"the source has no OPTIONS block between {BEGIN!r} and {END!r}: is it a template?")
    return begin, end + len(END)


def read_options(source: str) -> dict[str, Any]:
    """The OPTIONS dict of a template or rendered candidate source."""
    begin, end = _block(source)
    body = source[begin:end]
    try:
        tree = ast.parse(body)
        assign = next(n for n in tree.body if isinstance(n, ast.Assign | ast.AnnAssign))
        value = ast.literal_eval(assign.value)  # type: ignore[arg-type]
    except (SyntaxError, StopIteration, ValueError) as e:
        raise ConfigError(f"the OPTIONS block is not a literal dict: {e}") from None
    if not isinstance(value, dict):
        raise ConfigError("OPTIONS must be a dict literal")
    return value


def parse_settings(items: list[str]) -> dict[str, Any]:
    """OPTION=VALUE texts (a command line's) as options: VALUE a Python literal (True, 1, None), else a string."""
    out: dict[str, Any] = {}
    for item in items:
        name, sep, text = item.partition("=")
        if not sep:
            raise ConfigError(f"{item!r} is not OPTION=VALUE")
        try:
            out[name] = ast.literal_eval(text)
        except (ValueError, SyntaxError):
            out[name] = text
    return out


def validate(options: dict[str, Any]) -> dict[str, Any]:
    """`options` over the baseline, after checking every name and value against its Move."""
    for name, value in options.items():
        move = MOVES_BY_NAME.get(name)
        if move is None:
            raise ConfigError(f"unknown option {name!r}: known options are {', '.join(sorted(MOVES_BY_NAME))}")
        if value not in move.values or type(value) is not type(move.values[move.values.index(value)]):
            raise ConfigError(f"option {name}={value!r} is not allowed: use one of "
                              f"{', '.join(repr(v) for v in move.values)}")
    return {**baseline_options(), **options}


def render(template: str, options: dict[str, Any]) -> str:
    """Candidate source: template `template` (a name or a template's source) with `options` substituted.

    Options not given keep their baseline value. Unknown names or disallowed values raise ConfigError.
    """
    source = compose(template) if "\n" not in template else template
    return _substitute(source, validate(options))


def _substitute(source: str, full: dict[str, Any]) -> str:
    """`source` with its OPTIONS block replaced by `full`, every option's value."""
    begin, end = _block(source)
    lines = [f"{BEGIN} (rendered by athanor.moves.render) ---", "OPTIONS: dict[str, Any] = {"]
    lines += [f"    {name!r}: {value!r}," for name, value in full.items()]
    lines += ["}", END]
    return source[:begin] + "\n".join(lines).replace("'", '"') + source[end:]
