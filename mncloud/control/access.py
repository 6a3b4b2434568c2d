"""What the controller VM gets to launch as the laptop would: nothing secret in plain sight.

The controller's launches need what `mncloud up` had on the laptop: the run's `--secret`
values, the bucket's endpoint (`AWS_ENDPOINT_URL`, an S3-compatible store), and a way to the
API server as the laptop's user. SkyPilot's task has two places for values: `envs` (plain,
kept in its YAML, its job table, `sky jobs queue`) and `secrets` (sent to the VM, redacted
everywhere SkyPilot shows a task). So:

    SKYPILOT_API_SERVER_ENDPOINT   envs, without any `user:password@` (that URL in secrets)
    the run's --secret NAMEs        secrets (values read here, at `up`; a missing one: one
                                    line, exit 2, before any VM)
    SKYPILOT_SERVICE_ACCOUNT_TOKEN  secrets, when the laptop has one
    AWS_ENDPOINT_URL (and region)   envs: an address, not a credential

and `api_server_access: true` on the controller's task (SkyPilot then gives it a token of the
user who launched it, where the server has service accounts), while training tasks keep none
(`api_server_access: false`): no training node holds a key to the API server. So the
controller's queue and cancel calls are the laptop user's, and see its jobs.
"""

from __future__ import annotations

import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass, field

from mncloud.errors import SpecError

ENDPOINT_ENV = "SKYPILOT_API_SERVER_ENDPOINT"
TOKEN_ENV = "SKYPILOT_SERVICE_ACCOUNT_TOKEN"
CARRIED_ENVS = ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_REGION", "AWS_DEFAULT_REGION")
"""Plain settings the controller's launches need as the laptop had them (addresses only)."""


@dataclass
class ControllerAccess:
    """The controller task's plain envs and its secrets (names → values, never rendered)."""

    envs: dict[str, str] = field(default_factory=dict)
    secrets: dict[str, str] = field(default_factory=dict)


def redact_url(url: str) -> str:
    """`url` without a `user:password@` part (for envs, messages and records)."""
    parts = urllib.parse.urlsplit(url)
    if parts.username is None and parts.password is None:
        return url
    host = parts.hostname or ""
    netloc = f"[{host}]" if ":" in host else host
    if parts.port is not None:
        netloc += f":{parts.port}"
    return urllib.parse.urlunsplit(parts._replace(netloc=netloc))


def controller_access(
    api_server: str, secret_names: list[str], environ: Mapping[str, str]
) -> ControllerAccess:
    """The controller's envs and secrets (see the module docstring); SpecError, one line,
    when a secret the run needs is not set here."""
    missing = [name for name in secret_names if name not in environ]
    if missing:
        raise SpecError(
            f"secret {', '.join(missing)} is not set in your environment; the deadline "
            "controller launches with it: export it before `mncloud up` (it is sent to "
            "SkyPilot as a secret, never written to files)"
        )
    access = ControllerAccess()
    plain = redact_url(api_server)
    access.envs[ENDPOINT_ENV] = plain
    if plain != api_server:
        access.secrets[ENDPOINT_ENV] = api_server  # the secret overrides the plain env
    access.envs.update({k: environ[k] for k in CARRIED_ENVS if environ.get(k)})
    access.secrets.update({name: environ[name] for name in secret_names})
    if environ.get(TOKEN_ENV):
        access.secrets[TOKEN_ENV] = environ[TOKEN_ENV]
    return access
