"""`athanor <command>`: parse, call one library function, render.

Each part registers its commands from a module in `athanor.commands`. Errors that
athanor raises on purpose (`AthanorError`) print as one line on stderr with exit status 2.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import signal
import sys
import threading
from collections.abc import Sequence
from typing import Any

from athanor import __version__
from athanor.errors import AthanorError

# Modules under athanor.commands that define `register(subparsers)`.
COMMAND_MODULES = ("model", "traffic", "engine", "evaluate", "compile", "bench", "serve", "dashboard", "plan")


class _Help(argparse.HelpFormatter):
    """Each option's help ends with its default, unless the help names it already or there is none worth showing
    (no value, a flag that is off, an empty string)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        shown = action.default not in (None, False, "", argparse.SUPPRESS) and action.option_strings
        if not shown or "default" in text or text == argparse.SUPPRESS:
            return action.help
        return f"{text} (default: %(default)s)"


class _Parser(argparse.ArgumentParser):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", _Help)
        super().__init__(*args, **kwargs)
        if " " in self.prog:  # a sub-command's parser: -v may come after the command too (absent: the top's stays)
            self.add_argument("-v", "--verbose", action="store_true", default=argparse.SUPPRESS,
                              help="log progress at INFO level")

    def error(self, message: str) -> None:  # type: ignore[override]
        # argparse's own usage errors: one line, exit 2 (its default prints the whole usage).
        self.exit(2, f"{self.prog}: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="athanor", description="A continuous compiler for LLM inference.")
    parser.add_argument("--version", action="version", version=f"athanor {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="log progress at INFO level")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for name in COMMAND_MODULES:
        try:
            module = importlib.import_module(f"athanor.commands.{name}")
        except ModuleNotFoundError as e:
            if e.name == f"athanor.commands.{name}":
                continue  # that part has not landed yet
            raise
        module.register(sub)
    return parser


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where the program is, so a command ends as on Ctrl-C: its engine workers stopped, its
    temporary directories removed, what finished kept (the default action would kill this process alone)."""


def _terminate(signum: int, frame: object) -> None:
    raise Terminated


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(message)s")
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    on_main_thread = threading.current_thread() is threading.main_thread()  # only there may handlers be set
    previous = signal.signal(signal.SIGTERM, _terminate) if on_main_thread else None
    try:
        return int(args.func(args) or 0)
    except AthanorError as e:
        print(f"athanor: error: {e}", file=sys.stderr)
        return 2
    except Terminated:
        print("athanor: terminated", file=sys.stderr)
        return 143
    except KeyboardInterrupt:
        print("athanor: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # the reader went away (`athanor ... | head`): stop quietly, as Unix tools do
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    finally:
        if on_main_thread:
            signal.signal(signal.SIGTERM, previous)


if __name__ == "__main__":
    sys.exit(main())
