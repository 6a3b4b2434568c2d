"""Errors a user can act on. The CLI prints their message as one line and exits 2."""

from __future__ import annotations

from typing import Any


class MncloudError(Exception):
    """Base of every error mncloud raises on purpose; the message says how to mend it."""


class SpecError(MncloudError):
    """The request (flags, mncloud.yaml) is invalid."""


class CatalogError(MncloudError):
    """No price data, or no offer fits the request."""


class RenderError(MncloudError):
    """The task template failed to render or SkyPilot rejected the result."""


class StorageError(MncloudError):
    """A bucket operation failed permanently (missing bucket, denied, bad URL)."""


class CheckpointError(MncloudError):
    """A checkpoint could not be saved, verified or loaded."""


class BackendError(MncloudError):
    """Launching or operating a run failed."""


class AnswerLost(BackendError):
    """A launch was sent and its answer lost on the way: what it made is unknown, not failed
    (the server goes on with it)."""


class RunNotFoundError(BackendError):
    """No run with that name exists."""


class CancelError(BackendError):
    """A cancel the engine did not confirm; `live` are the jobs that may still run (and bill)."""

    def __init__(self, message: str, live: list[int]) -> None:
        super().__init__(message)
        self.live = live


def first_error(err: Any, context: str | None = None) -> str:
    """A pydantic `ValidationError` as one line: the one place that turns one into a message.

    Without `context`, the field is named as its flag with the value given:
    `--time-scale nan: it must be a finite number`; a validator's own message that already names
    its flag (`--name 'X': use lower-case …`) stands as it is. With `context` (a file: `trace
    t.json`, `mncloud.yaml`), the field is named by its path in it:
    `trace t.json: metadata.gap_seconds: Field required`.
    """
    first = err.errors()[0]
    where = ".".join(str(part) for part in first.get("loc", ()))
    message = str(first.get("msg", "invalid value")).removeprefix("Value error, ")
    message = message.replace("Input should be", "it must be", 1)
    if context is not None:
        return f"{context}: {where}: {message}" if where else f"{context}: {message}"
    if message.startswith("--"):
        return message
    return f"--{where.replace('_', '-')}{_shown(first.get('input'))}: {message}"


def _shown(value: Any) -> str:
    """The value a user gave, as the one-line message shows it after the flag."""
    if isinstance(value, bool) or value is None:
        return ""
    if isinstance(value, float):
        return f" {value:g}"
    if isinstance(value, int):
        return f" {value}" if value.bit_length() < 64 else " (a huge number)"
    if isinstance(value, str):
        text = repr(value)
        return f" {text[:60]}…" if len(text) > 60 else f" {text}"
    return ""
