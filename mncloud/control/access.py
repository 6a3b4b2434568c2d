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
    the run's --env values          secrets, as one JSON value (`RUN_ENVS_SECRET`): the
                                    state in the bucket names them only
    AWS_ENDPOINT_URL (and region)   envs: an address, not a credential

and `api_server_access: true` on the controller's task (SkyPilot then gives it a token of the
user who launched it, where the server has service accounts), while training tasks keep none
(`api_server_access: false`): no training node holds a key to the API server. So the
controller's queue and cancel calls are the laptop user's, and see its jobs. The state's
copies (`state.save_state`) have SkyPilot's messages scrubbed (`scrubbed_json`), and a state
read on the controller VM gets its `--env` values back from the secret (`with_run_envs`).
"""

from __future__ import annotations

import ipaddress
import json
import time
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from mncloud.errors import SpecError
from mncloud.redact import REDACTED, spec_redactor

ENDPOINT_ENV = "SKYPILOT_API_SERVER_ENDPOINT"
TOKEN_ENV = "SKYPILOT_SERVICE_ACCOUNT_TOKEN"
CARRIED_ENVS = ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_REGION", "AWS_DEFAULT_REGION")
"""Plain settings the controller's launches need as the laptop had them (addresses only)."""
RUN_ENVS_SECRET = "MNCLOUD_RUN_ENVS"
"""The controller task's secret carrying the run's `--env` values (JSON): the state in the
bucket names them only (`state.save_state`), the controller reads them back from it."""


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
    api_server: str,
    secret_names: list[str],
    environ: Mapping[str, str],
    run_envs: Mapping[str, str] | None = None,
) -> ControllerAccess:
    """The controller's envs and secrets (see the module docstring); SpecError, one line,
    when a secret the run needs is not set here. `run_envs`: the run's `--env` values."""
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
    if run_envs:
        access.secrets[RUN_ENVS_SECRET] = json.dumps(dict(run_envs))
    return access


_LOCAL_NAMES = ("localhost", "localhost.localdomain", "ip6-localhost", "ip6-loopback")


def on_this_machine_only(url: str) -> bool:
    """Whether a controller VM in a cloud surely cannot reach the API server at `url`: a
    loopback, unspecified or link-local address in any spelling (127.0.0.0/8, `::1`,
    `::ffff:127.0.0.1`, 0.0.0.0, 169.254.0.0/16, fe80::/10), a `localhost` name or a `.local`
    (mDNS) one. Private addresses (10/8, a VPC's) and other names may be reachable: allowed."""
    host = (urllib.parse.urlsplit(url if "//" in url else f"//{url}").hostname or "").lower()
    host = host.rstrip(".")
    if host in _LOCAL_NAMES or host.endswith((".localhost", ".local")):
        return True
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return address.is_loopback or address.is_unspecified or address.is_link_local


def check_identity(
    info: Any, api_server: str, environ: Mapping[str, str], min_api_version: int
) -> None:
    """SpecError, one line, when the API server wants a login the controller VM would not have.

    `info`: the server's health answer (`sky.api_info()`). The controller's identity is the
    laptop's service-account token (`SKYPILOT_SERVICE_ACCOUNT_TOKEN`, carried as a secret),
    the `user:password@` of a basic-auth endpoint (likewise), or the token SkyPilot makes for
    a task with `api_server_access: true`, which it does only where the server has service
    accounts enabled and is new enough (`min_api_version`).

    `external_proxy_auth_enabled` alone proves nothing: SkyPilot 0.14.1 reports it on every
    server whose `server.yaml` does not turn it off (`sky/server/config.py`), a plain server
    with no auth at all included (`tests/test_sky_contract.py`). A proxy that logged the
    laptop in names its user in the answer (`info.user`), so the flag counts only then.

    A controller whose endpoint carries a password launches without `api_server_access`
    (`templates/control.yaml.j2`): SkyPilot's client writes the URL it reaches the server at
    into the plain envs of a task with it, password included. So it gets no SkyPilot token;
    where it would need one, refused."""
    proxy = bool(getattr(info, "external_proxy_auth_enabled", False))
    proxy = proxy and getattr(info, "user", None) is not None
    wants = [
        what
        for wanted, what in (
            (getattr(info, "basic_auth_enabled", False), "basic auth"),
            (getattr(info, "ingress_basic_auth_enabled", False), "basic auth on its ingress"),
            (proxy, "a login through its auth proxy (SSO)"),
        )
        if wanted
    ]
    if not wants or environ.get(TOKEN_ENV):
        return
    has_password = redact_url(api_server) != api_server
    if has_password and not proxy:
        return
    if gets_skypilots_token(info, min_api_version):
        if not has_password:
            return
        raise SpecError(  # the token comes only with api_server_access, and so would the URL
            f"SkyPilot's API server at {redact_url(api_server)} wants {' and '.join(wants)}; "
            "the deadline controller would need SkyPilot's token, and SkyPilot would then write "
            "your endpoint's password into the controller's plain envs: export "
            "SKYPILOT_SERVICE_ACCOUNT_TOKEN before `mncloud up`, or use an endpoint without "
            "`user:password@`"
        )
    raise SpecError(
        f"SkyPilot's API server at {redact_url(api_server)} wants {' and '.join(wants)}, and "
        "the deadline controller's VM would have no login: export SKYPILOT_SERVICE_ACCOUNT_TOKEN "
        "(a service-account token, `sky api login --token`) before `mncloud up`, or enable "
        "service accounts on the server (ENABLE_SERVICE_ACCOUNTS=true) so SkyPilot gives the "
        "controller your token"
    )


CONTROLLER_TOKEN_DAYS = 3
"""Days the token SkyPilot makes for a task with `api_server_access: true` lives: SkyPilot
0.14's `sky/jobs/constants.py` `MANAGED_JOB_TOKEN_TTL_DAYS`, never renewed while the job runs
(tests/test_control_credentials.py holds the two equal)."""


def gets_skypilots_token(info: Any, min_api_version: int) -> bool:
    """Whether SkyPilot gives the controller a token of its own (`api_server_access`): where
    the server has service accounts enabled and is new enough. That token replaces any the
    laptop carried (`sky/jobs/server/core.py` writes it over the task's secret)."""
    try:
        version = int(getattr(info, "api_version", "") or 0)
    except ValueError:
        version = 0
    return bool(getattr(info, "service_account_token_enabled", False)) and (
        version >= min_api_version
    )


TOKEN_MARGIN_S = 3600.0
"""How long before its API token expires the controller stops the run (`horizon.py`): the
stop's notice, its cancel and a run of unsure looks with backoff (`unsure.py`) fit in it."""


def token_expiry(environ: Mapping[str, str]) -> float | None:
    """When the service-account token in `environ` expires (its JWT's `exp`, or SkyPilot's
    legacy `e`: `sky/users/token_service.py`); None without one, or one that never expires.
    Read, not verified: the server verifies, the controller only plans by it."""
    import jwt

    token = environ.get(TOKEN_ENV, "")
    if not token:
        return None
    try:
        claims = jwt.decode(token.removeprefix("sky_"), options={"verify_signature": False})
    except jwt.PyJWTError:
        return None
    expires = claims.get("exp", claims.get("e"))
    return float(expires) if isinstance(expires, int | float) else None


def check_token_life(
    info: Any, deadline_s: float, min_api_version: int, environ: Mapping[str, str] | None = None
) -> None:
    """SpecError, one line, when the deadline is past the controller's horizon. Where SkyPilot
    gives each controller job a token of its own (`gets_skypilots_token`), there is none: the
    controller hands the run to a fresh controller job, with a fresh token, before its own
    expires (`handoff.py`). Elsewhere the controller carries the laptop's token (`environ`'s
    `SKYPILOT_SERVICE_ACCOUNT_TOKEN`, as a secret), never renewed, and so would a successor:
    the controller stops the run `TOKEN_MARGIN_S` before it expires (`horizon.py`), so a
    later deadline would be missed for sure."""
    if gets_skypilots_token(info, min_api_version):
        return
    expires = token_expiry(environ or {})
    if expires is None:
        return
    life_s = max(0.0, expires - TOKEN_MARGIN_S - time.time())
    if deadline_s <= life_s:
        return
    hours = f"{life_s // 3600:.0f}"
    raise SpecError(
        f"--deadline {deadline_s / 3600:g}h is past the deadline controller's horizon ({hours} h: "
        f"the {TOKEN_ENV} it carries expires in {(expires - time.time()) / 3600:.0f} h, and "
        "SkyPilot gives no controller job a token of its own here, so a fresh controller would "
        f"carry the same one; the controller stops the run at a checkpoint "
        f"{TOKEN_MARGIN_S / 3600:g} h before it expires); give --deadline {hours}h or less, a "
        "token that lives longer, or enable service accounts on the server "
        "(ENABLE_SERVICE_ACCOUNTS=true), and run `mncloud up --deadline ... --resume` for the "
        "rest once it ends"
    )


def scrubbed_json(data: dict[str, Any]) -> dict[str, Any]:
    """A controller state's JSON (`ControlState.model_dump`), its free-text fields (where
    SkyPilot's messages land) scrubbed, in place."""
    scrub = spec_redactor(data["spec"]).scrub
    for key in ("detail", "controller", "closing"):
        if data.get(key):
            data[key] = scrub(data[key])
    launching = data.get("launching")
    reasons = [*data["decisions"], *([launching, launching["decision"]] if launching else [])]
    for one in reasons:
        one["reason"] = scrub(one["reason"])
    meta = (data.get("live") or {}).get("meta") or {}
    if meta.get("error"):
        meta["error"] = scrub(meta["error"])
    return data


def with_run_envs(spec: dict[str, Any], environ: Mapping[str, str]) -> dict[str, Any]:
    """A controller state's spec read from the bucket with its `--env` values back, from the
    controller task's secret (`RUN_ENVS_SECRET`); as it was where there is none (the laptop)."""
    carried = environ.get(RUN_ENVS_SECRET)
    envs = spec.get("envs") or {}
    if not carried or REDACTED not in envs.values():
        return spec
    values = json.loads(carried)
    return dict(spec, envs={k: values.get(k, v) if v == REDACTED else v for k, v in envs.items()})
