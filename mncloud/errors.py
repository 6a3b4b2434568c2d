"""Errors a user can act on. The CLI prints their message as one line and exits 2."""

from __future__ import annotations


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


class RunNotFoundError(BackendError):
    """No run with that name exists."""
