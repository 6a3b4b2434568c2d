"""The fake held to SkyPilot's real API server with logins on: who each request is from, and
what each user sees of the others' requests, the same on both sides (`side`: `real`, `fake`).

The real server (0.14.1, offline on 127.0.0.1) runs with service-account tokens on
(`ENABLE_SERVICE_ACCOUNTS=true`: they authenticate on loopback, where basic auth lets every
caller through unauthenticated). Its first admin logs in through SkyPilot's default external
auth-proxy header and makes three tokens: `laptop` and `other` (role `user`), `admin`. The
deadline controller is the laptop's user: it carries the laptop's token, or SkyPilot's token
for the user who launched it (`sky/jobs/server/core.py` `_create_job_api_token`), so it is
`laptop` here, with another `SKYPILOT_USER_ID`. See docs/guides/skypilot-contract.md.
"""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pytest

from mncloud.constants import RUN_ID_ENV
from tests.skyapi import forget_server, free_port, serve

if TYPE_CHECKING:
    from tests.fakesky import FakeSky

LAPTOP_ID, VM_ID = "a1ce0001", "c0417001"
"""What the laptop and the controller's VM set as `SKYPILOT_USER_ID`: ignored under a login."""
ROLES = {"laptop": "user", "other": "user", "admin": "admin"}
PROXY_HEADER = "X-Auth-Request-Email"
"""SkyPilot's default external auth-proxy header (`sky/server/config.py`): what an
oauth2-proxy in front of the server sets; the server takes its user on trust."""


@dataclass(frozen=True)
class Account:
    """A service account: its name (`user_name`), token and user id (`user_id`)."""

    name: str
    token: str
    user_id: str


def _make_token(url: str, name: str, role: str) -> Account:
    """A service-account token made by the server's first admin (logged in by the proxy
    header), as `POST /users/service-account-tokens` (the dashboard's call) makes it."""
    body = {"token_name": f"mn_{name}", "expires_in_days": 1, "role": role}
    made = urllib.request.Request(
        f"{url}/users/service-account-tokens",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json", PROXY_HEADER: "admin@example.com"},
    )
    with urllib.request.urlopen(made, timeout=60) as answer:
        token = json.loads(answer.read())
    return Account(token["token_name"], token["token"], token["service_account_user_id"])


@pytest.fixture(scope="module")
def auth_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, dict]]:
    """SkyPilot's API server with service accounts on, no cloud; its URL and the accounts."""
    folder = tmp_path_factory.mktemp("sky-api-server-auth")
    with serve(folder, {"ENABLE_SERVICE_ACCOUNTS": "true"}) as url:
        yield url, {who: _make_token(url, who, role) for who, role in ROLES.items()}


@dataclass
class Side:
    """One side of a contract with logins: the real server or the fake, and its accounts."""

    name: str
    url: str
    fake: FakeSky | None
    accounts: dict[str, Account]
    monkeypatch: pytest.MonkeyPatch = field(repr=False)

    def login(self, who: str | None, user_id: str = LAPTOP_ID) -> None:
        """The client is `who`'s token from now on (None: no token), `user_id` its hash."""
        if who is None:
            self.monkeypatch.delenv("SKYPILOT_SERVICE_ACCOUNT_TOKEN", raising=False)
        else:
            self.monkeypatch.setenv("SKYPILOT_SERVICE_ACCOUNT_TOKEN", self.accounts[who].token)
        self.monkeypatch.setenv("SKYPILOT_USER_ID", user_id)
        forget_server()


@pytest.fixture(params=["real", "fake"])
def side(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[Side]:
    """The client pointed at the real server with logins, or the fake with the same accounts
    (`FakeSky.service_account`); no cloud enabled on either."""
    from tests import fakesky

    if request.param == "real":
        url, accounts = request.getfixturevalue("auth_server")
        fake = None
    else:
        url, fake = f"http://127.0.0.1:{free_port()}", fakesky.install(monkeypatch)
        fake.cloud_access = False
        accounts = {
            who: Account(f"mn_{who}", f"sky_fake-{who}", f"sa-fake0{n}")
            for n, who in enumerate(ROLES)
        }
        for who, one in accounts.items():
            fake.service_account(
                one.token, fakesky.User(one.name, one.user_id), ROLES[who] == "admin"
            )
    monkeypatch.setenv("SKYPILOT_API_SERVER_ENDPOINT", url)
    monkeypatch.setenv("SKYPILOT_USER", fakesky.LAPTOP.name)
    one = Side(request.param, url, fake, accounts, monkeypatch)
    one.login(None)
    yield one
    forget_server()


def _launch(side: Side, run_id: str, name: str) -> str:
    """A `jobs.launch` request (on the fake: held in flight, as the real one is for seconds)."""
    import sky
    import sky.jobs

    if side.fake is not None:
        side.fake.held.add("jobs.launch")
    task = sky.Task(name="t", run="echo hi", envs={RUN_ID_ENV: run_id})
    return str(sky.jobs.launch(task, name=name))


def _rows(**kwargs: Any) -> dict[str, Any]:
    import sky

    return {r.request_id: r for r in sky.api_status(**kwargs)}


def test_a_login_is_who_each_request_is_from(side: Side) -> None:
    """Under a token, the server names the token's user in `api_info` and as each request's
    user, and writes that user into the request's `env_vars` over the `SKYPILOT_USER_ID` the
    client sent: the controller with the laptop's token is the laptop's user. A non-admin's
    queue of all users' jobs is refused only for want of a jobs controller, as without a login
    (mncloud reads none); mncloud lets the controller launch (it carries the token)."""
    import sky
    import sky.jobs
    from sky import exceptions as sx
    from sky.server.constants import MIN_API_ACCESS_API_VERSION

    from mncloud.backends.skypilot import find
    from mncloud.control.access import TOKEN_ENV, check_identity

    laptop = side.accounts["laptop"]
    for user_id in (LAPTOP_ID, VM_ID):  # the laptop, then the controller's VM
        side.login("laptop", user_id)
        info = sky.api_info()
        assert info.service_account_token_enabled and info.user is not None
        assert (info.user.id, info.user.name) == (laptop.user_id, laptop.name)
        check_identity(info, side.url, {TOKEN_ENV: laptop.token}, MIN_API_ACCESS_API_VERSION)
        request_id = sky.jobs.queue_v2(refresh=False, all_users=True)
        with pytest.raises(sx.ClusterNotUpError, match=r"^No in-progress managed jobs\.$"):
            sky.get(request_id)  # a non-admin may ask for all users: no controller, though
        assert find.jobs_named_exactly("auth-none") == []  # mncloud's look: all users, none
        row = _rows(request_ids=[request_id])[request_id]
        assert (row.user_id, row.user_name) == (laptop.user_id, laptop.name)
        sent = json.loads(row.request_body)["env_vars"]
        assert (sent["SKYPILOT_USER_ID"], sent["SKYPILOT_USER"]) == (laptop.user_id, laptop.name)

    side.login(None)  # no token: a loopback caller with no login, as on a plain server
    assert sky.api_info().user is None


def test_each_user_sees_its_own_requests_and_an_admin_no_other_body(side: Side) -> None:
    """A non-admin's `api_status` lists its own requests only (not another user's, not the
    server's daemons); another's id is "not found" to its `get`, `stream_and_get` and
    `api_status`. An admin's lists every user's, the others' bodies `null`. A caller with no
    login sees every body."""
    import sky
    from sky import exceptions as sx

    def launched(who: str, run_id: str) -> str:
        side.login(who)
        request_id = _launch(side, run_id, f"auth-{who}")
        with pytest.raises(sx.NoCloudAccessError):
            sky.get(request_id)
        return request_id

    mine, theirs = launched("laptop", "auth-run-1"), launched("other", "auth-run-2")
    owner = {mine: side.accounts["laptop"].user_id, theirs: side.accounts["other"].user_id}

    for who, own, other in (("laptop", mine, theirs), ("other", theirs, mine)):
        side.login(who)
        rows = _rows(all_status=True)
        assert own in rows and other not in rows
        assert {r.user_id for r in rows.values()} == {side.accounts[who].user_id}
        assert rows[own].status == "FAILED" and owner[own] in rows[own].request_body
        assert _rows(request_ids=[other]) == {}
        with pytest.raises(RuntimeError, match=f"Failed to get request {other}: 404"):
            sky.get(other)
        with pytest.raises(sx.ClientError, match="not found"):
            sky.stream_and_get(other)

    side.login("admin")
    request_id = sky.jobs.queue_v2(refresh=False)
    with pytest.raises(Exception):  # noqa: B017 (no jobs controller)
        sky.get(request_id)
    rows = _rows(all_status=True)
    assert {mine, theirs, request_id} <= set(rows)
    assert "skypilot-system" in {r.user_id for r in rows.values()}  # the daemons
    assert json.loads(rows[mine].request_body) is None
    assert json.loads(rows[theirs].request_body) is None
    assert json.loads(rows[request_id].request_body)["env_vars"]["SKYPILOT_USER_ID"] == (
        side.accounts["admin"].user_id
    )

    side.login(None)
    rows = _rows(all_status=True)
    assert "auth-run-1" in rows[mine].request_body and "auth-run-2" in rows[theirs].request_body


def test_mncloud_finds_the_runs_launches_as_the_controller_only(side: Side) -> None:
    """A launch of the laptop's run in flight: the controller (the laptop's user) finds it by
    its body and waits it out; another non-admin does not see it, an admin sees its row with a
    `null` body: their lookups find nothing, break on nothing, and their cancels (by its id,
    or of all users for the non-admin) do not reach it."""
    import sky

    from mncloud.backends.skypilot import find, lost

    side.login("laptop")
    launch = _launch(side, "auth-run-3", "auth-c")
    for who in ("other", "admin"):
        side.login(who)
        assert find.launches_in_flight("auth-c") == []
        find.wait_for_launch_requests("auth-run-3")  # nothing of theirs names it: no wait
        # by id, without all_users: the client sends its own SKYPILOT_USER_ID as the scope
        assert launch not in sky.get(sky.api_cancel(launch))
    side.login("other")
    assert not lost.server_failed(launch)  # not its to see, ended or not
    assert launch not in sky.get(sky.api_cancel(all_users=True))  # a non-admin's: its own
    if side.fake is not None:  # the fake holds it in flight: still unfinished, uncancelled
        side.login("laptop")
        assert _rows(request_ids=[launch])[launch].status == "PENDING"

    side.login("laptop", VM_ID)  # the controller
    found = find.launches_in_flight("auth-c", wait=True)
    assert found == [launch] if side.fake is not None else set(found) <= {launch}
    find.wait_for_launch_requests("auth-run-3")
    assert _rows(request_ids=[launch])[launch].status == "FAILED"  # waited out, not cancelled
    assert lost.server_failed(launch)
    side.login("other")
    assert not lost.server_failed(launch)  # not its to see
