"""The fake server's logins: service-account tokens and the scope each caller's requests are
listed in, as SkyPilot 0.14.1's server does with authentication on (a mixin of `FakeSky`).

A client that sends a token (`SKYPILOT_SERVICE_ACCOUNT_TOKEN`, the client's
`service_account_auth`) is that token's user, whatever `SKYPILOT_USER_ID` it sets: the server
writes the user into the request's `env_vars` (`sky/server/requests/executor.py`). One that
sends none is a loopback caller with no login (`auth_user` None): as a plain server, it sees
every request and every body. With a login (`sky/server/requests/role_filter.py`
`request_owner_scope`, `sky/server/requests/requests.py` `_request_body_for_display`):

- a non-admin's `api_status`, `get` and `api_cancel` reach its own requests only (another's
  id is "not found", a 404; the server's daemons are not listed);
- an admin's reach every user's, but the body of another user's request is `null`.
"""

from __future__ import annotations

import json
import os
from typing import Any

from sky.skylet import constants

from tests.fakesky.model import User
from tests.fakesky.wire import caller


def stamped(body: str, user: User) -> str:
    """A request body with the logged-in `user` in its `env_vars`, as the server writes it
    over what the client sent (`executor.schedule_request_async`)."""
    data = json.loads(body)
    data["env_vars"] = {**data.get("env_vars", {}), constants.USER_ID_ENV_VAR: user.user_hash,
                        constants.USER_ENV_VAR: user.name}  # fmt: skip
    return json.dumps(data)


class Auth:
    """Service accounts of the fake server: `tokens` (token → user) and `admins` (hashes)."""

    user: User
    tokens: dict[str, User]
    admins: set[str]

    def service_account(self, token: str, user: User, admin: bool = False) -> None:
        """A service-account token of `user` (role `admin` or `user`): the server has service
        accounts enabled from now on (`ENABLE_SERVICE_ACCOUNTS`)."""
        assert token.startswith("sky_"), "SkyPilot's client refuses a token without sky_"
        self.tokens[token] = user
        if admin:
            self.admins.add(user.user_hash)

    def _auth_user(self) -> User | None:
        """The user the server's login middleware finds: the token's, None without one."""
        token = os.environ.get(constants.SERVICE_ACCOUNT_TOKEN_ENV_VAR)
        if not token or not self.tokens:
            return None
        if token not in self.tokens:
            raise AssertionError("the fake server knows no such service-account token")
        return self.tokens[token]

    def _caller(self) -> User:
        """Who a request is from: the logged-in user, else the client's `SKYPILOT_USER_ID`."""
        return self._auth_user() or caller(self.user)

    def _scope(self) -> str | None:
        """`request_owner_scope`: the caller's hash for a logged-in non-admin, else None."""
        auth = self._auth_user()
        if auth is None or auth.user_hash in self.admins:
            return None
        return auth.user_hash

    def _visible(self, row: dict[str, Any]) -> bool:
        scope = self._scope()
        return scope is None or row["user_id"] == scope

    def _shown(self, row: dict[str, Any]) -> dict[str, Any]:
        """`row` as the caller is shown it: another user's body `null` to a logged-in one."""
        auth = self._auth_user()
        if auth is None or row["user_id"] == auth.user_hash:
            return row
        return dict(row, request_body=json.dumps(None))

    def _health_user(self) -> dict[str, str] | None:
        """The logged-in user as `/api/health` names it (`sky.api_info().user`)."""
        auth = self._auth_user()
        return None if auth is None else {"id": auth.user_hash, "name": auth.name}

    def _not_found(self, request_id: str) -> RuntimeError:
        """What the real client's `sky.get` raises for a request the server does not show the
        caller (`/api/get` answers 404, `sky/client/sdk.py` `get`)."""
        detail = json.dumps({"detail": f"Request {request_id!r} not found"}, separators=(",", ":"))
        return RuntimeError(f"Failed to get request {request_id}: 404 {detail}")
