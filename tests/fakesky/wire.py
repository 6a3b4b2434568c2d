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


def caller(default: Any) -> Any:
    """The user the client process is to the server: `SKYPILOT_USER_ID` (with `SKYPILOT_USER`
    its name) where set, as the real client sends it in every request body
    (`payloads.request_body_env_vars`), else `default` (the fake's `user`: the hash file's)."""
    import getpass
    import os

    from sky.skylet import constants
    from sky.utils import common_utils

    from tests.fakesky.model import User

    user_hash = os.environ.get(constants.USER_ID_ENV_VAR)
    if not common_utils.is_valid_user_hash(user_hash) or user_hash == default.user_hash:
        return default
    return User(os.environ.get(constants.USER_ENV_VAR, getpass.getuser()), str(user_hash))


def wire_error(err: BaseException) -> BaseException:
    """A request's error as the client raises it: SkyPilot's `serialize_exception` on the
    server, JSON, `deserialize_exception` on the client (`sky/client/sdk.py` `get`)."""
    from sky import exceptions as sx

    try:
        data = json.loads(json.dumps(sx.serialize_exception(err)))
    except TypeError:  # an attribute JSON cannot carry (a test's own exception): as it is
        return err
    return sx.deserialize_exception(data)


def _daemon(request_id: str, name: str) -> dict[str, Any]:
    from sky.server.requests.request_names import RequestName

    return {"request_id": request_id, "name": server_name(RequestName[name].value),
            "entrypoint": "run_event", "request_body": "{}", "status": "RUNNING",
            "created_at": 0.0, "user_id": "skypilot-system", "user_name": "skypilot-system",
            "return_value": "null", "error": "null", "pid": None, "schedule_type": "short",
            "finished_at": None}  # fmt: skip


DAEMONS = [
    _daemon("skypilot-status-refresh-daemon", "REQUEST_DAEMON_STATUS_REFRESH"),
    _daemon("skypilot-volume-status-refresh-daemon", "REQUEST_DAEMON_VOLUME_REFRESH"),
    _daemon("expired-token-cleanup-daemon", "REQUEST_DAEMON_EXPIRED_TOKEN_CLEANUP"),
]
"""The server's own requests a plain 0.14 server lists as RUNNING from its start
(`sky/server/daemons.py` `INTERNAL_REQUEST_DAEMONS`, those it does not skip), user
`skypilot-system`: `sky.api_status` lists them among the users' requests."""
