"""A status line for long commands: one live, refreshing line on a terminal; a plain line now and then elsewhere.

`Progress` owns the line and nothing else: the caller builds the status (a text, a function that makes it at each
refresh, or a few named fields) and prints its own event lines through `Progress.print`, which puts them above the
live line. The command that runs the work holds the Progress; the library code it calls only takes a plain
`Callable[[str], None]` (or a typed status of its own), so nothing below the CLI knows about terminals.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections.abc import Callable
from types import TracebackType
from typing import IO, Any

from rich.console import Console
from rich.live import Live
from rich.text import Text

PLAIN_INTERVAL_S = 10.0
"""Seconds between status lines where output is not a terminal: often enough that a log shows the work moving,
seldom enough that a long run's log stays mostly its events."""

REFRESH_PER_S = 2.0
"""Redraws of the live line per second: a clock in it moves visibly, and the redraw costs the work nothing."""

Status = str | Callable[[], str]
"""A status: its text, or a function that makes it at each refresh (so a clock in it moves between updates)."""


class Progress:
    """A status line on `console`: live on a terminal, else printed plainly every `interval_s` when it changed.

    Use as a context manager (`with Progress(console) as progress:`): leaving it, by an exception or Ctrl-C too,
    removes the live line and gives back the cursor and the streams it took over."""

    def __init__(self, console: Console | None = None, *, interval_s: float = PLAIN_INTERVAL_S,
                 auto_refresh: bool = True) -> None:
        self.console = console if console is not None else Console(highlight=False)
        self.interval_s = interval_s
        """Seconds between plain status lines (where the console is not a terminal)."""
        self.auto_refresh = auto_refresh
        """Redraw (or print) from a thread of its own, so a status function's clock moves; False: only when the
        status is set or updated, from the caller's thread (no thread runs beside work a benchmark times)."""
        self.live = self.console.is_terminal
        """Whether the status is one live line (a terminal) or plain lines."""
        self._status: Status = ""
        self._printed = ("", 0.0)
        """The last plain line and when it was printed (`time.monotonic`; at first, when the Progress opened)."""
        self._open = False
        self._fields: dict[str, str] = {}
        self._display: Live | None = None
        self._stop = threading.Event()
        self._printer: threading.Thread | None = None
        self._handlers: list[tuple[logging.StreamHandler[Any], IO[str]]] = []

    # -- what the line says ---------------------------------------------------------------------
    def set(self, status: Status) -> None:
        """Replace the status (named fields given to `update` stay, before it)."""
        self._status = status
        self._changed()

    def update(self, **fields: object) -> None:
        """Set named fields, shown as "name value" in the order first given; a field set to None is dropped."""
        for name, value in fields.items():
            if value is None:
                self._fields.pop(name, None)
            else:
                self._fields[name] = str(value)
        self._changed()

    def text(self) -> str:
        """The status line as it reads now."""
        status = self._status() if callable(self._status) else self._status
        parts = [f"{name} {value}" for name, value in self._fields.items()]
        return " | ".join([*parts, status] if status else parts)

    def print(self, line: str) -> None:
        """An event line, printed as it is (no markup), above the live line."""
        self.console.print(line, markup=False, highlight=False, emoji=False, soft_wrap=True)

    # -- showing it -------------------------------------------------------------------------------
    def __enter__(self) -> Progress:
        self._open, self._printed = True, ("", time.monotonic())
        if self.live:
            # The live line redraws over whatever the program writes to the same terminal, so writes to a
            # terminal stream (and log records, whose handlers keep the stream they were made with) go through
            # the console, above the line; a stream that is a file or a pipe keeps its writes.
            self._display = Live(console=self.console, get_renderable=self._renderable, transient=True,
                                 auto_refresh=self.auto_refresh, refresh_per_second=REFRESH_PER_S,
                                 redirect_stdout=_is_terminal(sys.stdout), redirect_stderr=_is_terminal(sys.stderr))
            before = (sys.stdout, sys.stderr)
            self._display.start(refresh=True)
            self._route_log_handlers({id(b): a for b, a in zip(before, (sys.stdout, sys.stderr)) if b is not a})
        elif self.auto_refresh:
            self._printer = threading.Thread(target=self._print_plainly, name="progress", daemon=True)
            self._printer.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def close(self) -> None:
        """Stop showing the status (the live line is removed); safe to call twice."""
        self._open = False
        self._stop.set()
        try:
            for handler, stream in self._handlers:
                handler.setStream(stream)
            self._handlers = []
        finally:
            if self._display is not None:
                self._display.stop()
                self._display = None
            if self._printer is not None:
                self._printer.join(timeout=1.0)
                self._printer = None

    def _renderable(self) -> Text:
        # One line, cut at the terminal's width: a wrapped status would leave a stale line behind at each redraw.
        return Text(self.text(), no_wrap=True, overflow="ellipsis")

    def _changed(self) -> None:
        if self.auto_refresh or not self._open:
            return  # the thread shows it at its next turn (or nothing shows it: not opened, or closed)
        if self._display is not None:
            self._display.refresh()
        elif not self.live and time.monotonic() - self._printed[1] >= self.interval_s:
            self._print_plain()

    def _print_plainly(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._print_plain()

    def _print_plain(self) -> None:
        line = self.text()
        if line and line != self._printed[0]:  # the same status again says nothing a reader lacks
            self.print(line)
            self._printed = (line, time.monotonic())

    def _route_log_handlers(self, stand_ins: dict[int, IO[str]]) -> None:
        """Point the log handlers that wrote to a stream the live display took over (by the stream's id) at its
        stand-in; `close` points them back."""
        loggers = [logging.getLogger(), *(lg for lg in logging.root.manager.loggerDict.values()
                                          if isinstance(lg, logging.Logger))]
        for lg in loggers:
            for handler in lg.handlers:
                if isinstance(handler, logging.StreamHandler) and id(handler.stream) in stand_ins:
                    original = handler.setStream(stand_ins[id(handler.stream)])
                    if original is not None:
                        self._handlers.append((handler, original))


def _is_terminal(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        return False
