"""Helpers every command module shares: console output, JSON, one-line errors."""

from __future__ import annotations

import contextlib
import functools
import json
import signal
import sys
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import typer
from rich.console import Console, RenderableType
from rich.measure import Measurement
from rich.segment import Segments

from mncloud.errors import MncloudError

F = TypeVar("F", bound=Callable[..., Any])

console = Console()
err_console = Console(stderr=True)
#: Wider than any table mncloud prints: what `print_whole` measures a table's own width in.
_UNBOUNDED = 100_000


def one_line(message: str) -> str:
    """A message as one line, whatever a user's value inside it holds (a newline, a CR)."""
    return message.replace("\r", "\\r").replace("\n", "\\n")


def fail(message: str) -> typer.Exit:
    """Print one line on stderr and return the Exit(2) to raise."""
    print(f"error: {one_line(message)}", file=sys.stderr)
    return typer.Exit(code=2)


def handle_errors(func: F) -> F:
    """Turn an MncloudError from the core into one line on stderr and exit code 2."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except MncloudError as err:
            raise fail(str(err)) from None

    return wrapper  # type: ignore[return-value]


def print_json(data: Any) -> None:
    """Print data as indented JSON on stdout (no rich markup)."""
    sys.stdout.write(json.dumps(data, indent=2, sort_keys=False, default=str) + "\n")


def print_whole(renderable: RenderableType, out: Console | None = None) -> None:
    """Print a table whose cells hold paths, URLs or commands a user copies: at its own width,
    wider than the terminal if it must be, where a terminal folds the line and a copy is whole
    (rich would wrap or cut it at the terminal's width, mid-word). A line of text takes
    `soft_wrap=True` for the same."""
    out = out or console
    width = Measurement.get(out, out.options.update_width(_UNBOUNDED), renderable).maximum
    if width <= out.width:
        out.print(renderable)
        return
    segments = list(out.render(renderable, out.options.update_width(width)))
    out.print(Segments(segments), soft_wrap=True)


class Signalled(KeyboardInterrupt):
    """SIGTERM or SIGHUP, raised where a command waits, as Ctrl-C's KeyboardInterrupt is."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


@contextlib.contextmanager
def signals_interrupt() -> Iterator[None]:
    """Inside the block SIGTERM (`timeout`, a CI job's end) and SIGHUP (a closed terminal)
    raise `Signalled` where the command waits, so it ends as after Ctrl-C: its `finally` and
    `except KeyboardInterrupt` clean up, and a second signal cannot cut that short."""
    stops = (signal.SIGTERM, signal.SIGHUP)

    def interrupt(signum: int, _frame: object) -> None:
        for sig in stops:
            signal.signal(sig, signal.SIG_IGN)
        raise Signalled(signum)

    saved = {sig: signal.signal(sig, interrupt) for sig in stops}
    try:
        yield
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)
