"""Helpers every command module shares: console output, JSON, one-line errors."""

from __future__ import annotations

import functools
import json
import sys
from collections.abc import Callable
from typing import Any, TypeVar

import typer
from rich.console import Console

from mncloud.errors import MncloudError

F = TypeVar("F", bound=Callable[..., Any])

console = Console()
err_console = Console(stderr=True)


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
