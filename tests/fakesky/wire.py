"""The fake's side of the wire: the real SDK functions it binds to, and answers passed through
SkyPilot's own server-side encoder, JSON, and the client's decoder."""

from __future__ import annotations

import inspect
import json
from collections.abc import Callable
from typing import Any

import sky
import sky.jobs
from sky.client import sdk as client_sdk
from sky.jobs.client import sdk as jobs_sdk
from sky.server import constants as server_constants
from sky.server.requests.serializers import decoders, encoders


def server_name(name: str) -> str:
    """The name the API server gives a request of SDK call `name` (`jobs.launch` →
    `sky.jobs.launch`: `REQUEST_NAME_PREFIX`, `sky/server/requests/executor.py`)."""
    return server_constants.REQUEST_NAME_PREFIX + name


def wire(name: str, value: Any) -> Any:
    """`value` as the client gets it: the server's encoder, JSON, the client's decoder."""
    if inspect.isgenerator(value):
        return value  # a stream, not a request result
    full = server_name(name)
    encoded = encoders.get_encoder(full)(value)
    return decoders.get_decoder(full)(json.loads(json.dumps(encoded)))


MODULES = {"": (sky, client_sdk), "jobs.": (sky.jobs, jobs_sdk)}
_SDK_MODULES = {client_sdk.__name__, jobs_sdk.__name__}


def sdk_functions(module: Any) -> dict[str, Any]:
    """The public functions of `module` that come from SkyPilot's client SDK modules."""
    found = {}
    for attr in dir(module):
        value = getattr(module, attr, None)
        if attr.startswith("_") or not inspect.isfunction(inspect.unwrap(value)):
            continue
        if getattr(value, "__module__", None) in _SDK_MODULES:
            found[attr] = value
    return found


_ORIGINAL = {prefix: sdk_functions(modules[0]) for prefix, modules in MODULES.items()}
"""Captured when this module is imported, before any test patches the SDK."""


def real(name: str) -> Any:
    """The real SDK function `name` (`launch`, `jobs.cancel`), as imported before any patch."""
    prefix, _, short = name.rpartition(".")
    return _ORIGINAL[prefix + "." if prefix else ""][short]


def unfaked(name: str) -> Callable[..., Any]:
    def refuse(*_args: Any, **_kwargs: Any) -> Any:
        raise AssertionError(f"unfaked SkyPilot call sky.{name}")

    return refuse


def strict_records(model: Any, raw: list[dict[str, Any]]) -> list[Any]:
    """`raw` read into SkyPilot's response `model`, refusing a key the model does not have:
    SkyPilot's models ignore unknown keys (`extra='ignore'`), so a field SkyPilot renamed
    would otherwise pass unnoticed as a missing value."""
    known = set(model.model_fields) | {f.alias for f in model.model_fields.values() if f.alias}
    for one in raw:
        unknown = sorted(set(one) - known)
        if unknown:
            raise AssertionError(f"{model.__name__} has no field {', '.join(unknown)}")
    return [model.model_validate(one) for one in raw]
