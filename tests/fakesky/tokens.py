"""Service-account tokens as SkyPilot 0.14.1's API server issues them and refuses them once
expired, on the fake's clock (a mixin of `FakeSky`; who a token logs in is `auth.py`'s).

- **Issued** as `sky/users/token_service.py` `create_token` makes them: `sky_` + a JWT (HS256)
  of `{i, t, u, k, y, e, exp}`, `e` and `exp` its expiry; a login of its user (`Auth`).
- **To a managed job** with `api_server_access`, where the server has service accounts
  (`health["service_account_token_enabled"]`, or a token already issued: the server's
  `ENABLE_SERVICE_ACCOUNTS`): one token of the launching user valid
  `MANAGED_JOB_TOKEN_TTL_DAYS` (3), written into the task's secrets (`sky/jobs/server/core.py`
  `launch`, `_create_job_api_token`); `job_tokens[job_id]`.
- **Refused once expired**, on every request whose client sends it
  (`SKYPILOT_SERVICE_ACCOUNT_TOKEN`): the server answers 401 (`sky/server/server.py`
  `_handle_service_account_token`, "Service account token has expired"; PyJWT's `exp` check
  refuses from the second it names), which the client's health check turns into
  `ApiServerAuthenticationError` (`sky/server/common.py` `_handle_non_200_server_status` →
  NEEDS_AUTH, `check_server_healthy_or_start_fn`). Each refusal is kept in `refused` (the
  call's name).
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Callable
from typing import Any

import jwt
from sky import exceptions as sx
from sky.jobs import constants as job_constants
from sky.skylet import constants
from sky.users import token_service

from tests.fakesky.model import User

_SECRET = "fake-sky-jwt-secret-of-32-bytes-or-more"


class Tokens:
    """The fake server's service-account tokens' expiry (see the module docstring)."""

    clock: Callable[[], float] | None
    health: dict[str, Any]
    now: Callable[[], float]
    server_url: str
    tokens: dict[str, User]
    service_account: Callable[..., None]

    def _tokens_init(self) -> None:
        self.expiries: dict[str, float | None] = {}
        """Each issued token's expiry on the fake's clock (None: never)."""
        self.job_tokens: dict[int, str] = {}
        """The token written into each managed job's secrets (`api_server_access`)."""
        self.refused: list[str] = []
        """Calls answered 401 for an expired token, by name."""

    def issue_token(self, user: User, days: float | None) -> str:
        """A token of `user` valid `days` from now on the fake's clock (None: never expires);
        the server has service accounts from now on (`Auth.service_account`)."""
        now = int(self.now())
        payload: dict[str, Any] = {"i": token_service.JWT_ISSUER, "t": now, "u": user.user_hash,
                                   "k": secrets.token_urlsafe(12), "y": "sa"}  # fmt: skip
        expires = None if days is None else int(now + days * 86400)
        if expires is not None:
            payload["e"] = payload["exp"] = expires
        token = "sky_" + jwt.encode(payload, _SECRET, algorithm=token_service.JWT_ALGORITHM)
        self.service_account(token, user)
        self.expiries[token] = expires
        return token

    def _job_token(self, job_id: int, user: User, tasks: list[Any]) -> None:
        """The token a managed job with `api_server_access` gets (see the module docstring)."""
        if not (self.health.get("service_account_token_enabled") or self.tokens):
            return
        if any(one.api_server_access for one in tasks):
            days = job_constants.MANAGED_JOB_TOKEN_TTL_DAYS
            self.job_tokens[job_id] = self.issue_token(user, days)

    def _check_token(self, name: str) -> None:
        """401 for a token of this server past its expiry (see the module docstring)."""
        expires = self.expiries.get(os.environ.get(constants.SERVICE_ACCOUNT_TOKEN_ENV_VAR, ""))
        if expires is None or expires > int(self.now()):
            return
        self.refused.append(name)
        raise sx.ApiServerAuthenticationError(self.server_url)
