"""The fake held to SkyPilot's real API server: the SDK calls mncloud makes, made against the
real server (0.14.1, started here offline on 127.0.0.1, its state in a temporary folder) and
against the fake (`tests/fakesky`), with the same assertions on both (`side`: `real`, `fake`).

Only what needs no cloud is compared: request names, users and statuses in `sky.api_status`,
a cancelled request, a launch the server fails for want of a cloud, the queue and cancel of a
server that never launched a managed job, the user each process is, the endpoint the client
adds for `api_server_access`; and that mncloud's own code reads each answer right. The server
starts once for the module; where it cannot start, the `real` side skips with the reason.
See docs/guides/skypilot-contract.md.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pytest

from mncloud.constants import RUN_ID_ENV
from tests.skyapi import forget_server, free_port, serve

if TYPE_CHECKING:
    from tests.fakesky import FakeSky

LAPTOP_ID, VM_ID = "a1ce0001", "c0417001"
"""The two users of these tests: `LAPTOP_ID` is the fake's default user (`fakesky.LAPTOP`)."""
DAEMONS = {"sky.status-refresh", "sky.volume-refresh", "sky.expired-token-cleanup"}


@pytest.fixture(scope="module")
def real_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """SkyPilot's API server, no login, no cloud enabled (`tests/skyapi.serve`); its URL."""
    with serve(tmp_path_factory.mktemp("sky-api-server")) as url:
        yield url


@dataclass
class Side:
    """One side of a contract: the real server or the fake, and the URL the client uses."""

    name: str
    url: str
    fake: FakeSky | None


@pytest.fixture(params=["real", "fake"])
def side(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[Side]:
    """The client pointed at the real server, or the fake installed; the laptop's user either
    way (`SKYPILOT_USER_ID`, as the fake's default `LAPTOP`)."""
    from tests import fakesky

    if request.param == "real":
        url, fake = request.getfixturevalue("real_server"), None
    else:
        url, fake = f"http://127.0.0.1:{free_port()}", fakesky.install(monkeypatch)
    monkeypatch.setenv("SKYPILOT_API_SERVER_ENDPOINT", url)  # not local: never auto-started
    monkeypatch.setenv("SKYPILOT_USER_ID", LAPTOP_ID)
    monkeypatch.setenv("SKYPILOT_USER", fakesky.LAPTOP.name)
    forget_server()
    yield Side(request.param, url, fake)
    forget_server()


def _task(run_id: str, access: bool = True) -> Any:
    import sky

    return sky.Task(name="t", run="echo hi", envs={RUN_ID_ENV: run_id}, api_server_access=access)


def _launch(side: Side, run_id: str, name: str, access: bool = True) -> str:
    """A `jobs.launch` request (on the fake: held in flight, as the real one is for seconds)."""
    import sky
    import sky.jobs

    if side.fake is not None:
        side.fake.held.add("jobs.launch")
    return str(sky.jobs.launch(_task(run_id, access), name=name))


def _row(request_id: str) -> Any:
    import sky

    (row,) = sky.api_status([request_id], all_status=True)
    return row


def test_a_launch_without_a_cloud_fails_as_the_server_fails_it(side: Side) -> None:
    """No cloud enabled: `stream_and_get` and `get` raise `NoCloudAccessError` in the server's
    words, the request is FAILED, and mncloud says so in one line (a refusal, not a lost
    answer). First in the file: the server's first launch runs to its end here, before any
    request is cancelled (a launch cancelled mid-way once left the server's worker with a
    half-imported module, and the next launch failed with an AttributeError)."""
    import sky
    import sky.jobs
    from sky import exceptions as sx

    from mncloud.backends.skypilot import lost
    from mncloud.backends.skypilot.errors import one_line, translate_error
    from mncloud.errors import BackendError

    if side.fake is not None:
        side.fake.cloud_access = False
    request_id = sky.jobs.launch(_task("contract-run-2"), name="contract-b")
    for wait in (sky.stream_and_get, sky.get):
        with pytest.raises(sx.NoCloudAccessError) as failed:
            wait(request_id)
        assert one_line(failed.value) == "Cloud access is not set up. Run: sky check"
    assert _row(request_id).status == "FAILED"
    assert "SkyPilot has no cloud enabled" in str(translate_error(failed.value, "launch"))
    with pytest.raises(BackendError, match="no cloud enabled") as refused:
        lost.resolve("contract-b", request_id, "contract-run-2")
    assert not isinstance(refused.value, lost.LaunchAnswerLost)


def test_the_server_names_each_request_and_whose_it_is(side: Side) -> None:
    """A launch in flight is `sky.jobs.launch`, the caller's, its body naming the run id (what
    `find.wait_for_launch_requests` looks for), among the server's own daemons; cancelled, it
    is CANCELLED and `sky.get` raises `RequestCancelled`: mncloud takes it for a refusal."""
    import sky
    from sky import exceptions as sx

    from mncloud.backends.skypilot import find, lost
    from mncloud.errors import BackendError

    request_id = _launch(side, "contract-run-1", "contract-a")
    live = {r.request_id: r for r in sky.api_status(all_status=False)}
    row = live[request_id]
    assert row.name == find.launch_request_name() == "sky.jobs.launch"
    assert row.status in ("PENDING", "RUNNING") and row.user_id == LAPTOP_ID
    assert "contract-run-1" in row.request_body
    assert json.loads(row.request_body)["env_vars"]["SKYPILOT_USER_ID"] == LAPTOP_ID
    daemons = {r.name for r in live.values() if r.user_id == "skypilot-system"}
    assert daemons >= DAEMONS  # the server's own, listed with the users' requests
    assert find.launch_requests_naming(["contract-run-1"]) == [request_id]  # the lease's look
    assert find.unfinished_requests([request_id]) == [request_id]

    assert sky.get(sky.api_cancel(request_id)) == [request_id]
    for wait in (sky.get, sky.stream_and_get):
        with pytest.raises(sx.RequestCancelled, match="is cancelled by another process"):
            wait(request_id)
    assert _row(request_id).status == "CANCELLED"
    assert request_id not in {r.request_id for r in sky.api_status(all_status=False)}
    find.wait_for_launch_requests("contract-run-1")  # nothing in flight names it: no wait
    assert find.unfinished_requests([request_id]) == []  # CANCELLED is finished
    assert find.settle_launch_requests(["contract-run-1"], wait_s=0, poll_s=1, sleep=_never) == []
    with pytest.raises(BackendError, match="cancelled") as refused:
        lost.resolve("contract-a", request_id, "contract-run-1")
    assert not isinstance(refused.value, lost.LaunchAnswerLost)


def _never(_seconds: float) -> None:
    raise AssertionError("nothing in flight: no wait")


def test_no_managed_job_yet_the_queue_and_cancel_fail_and_mncloud_reads_none(
    side: Side,
) -> None:
    """A server that never launched a managed job has no jobs controller: `jobs.queue_v2` and
    `jobs.cancel` (an unknown job id included) fail with `ClusterNotUpError("No in-progress
    managed jobs.")`, through `get` and `stream_and_get`; mncloud reads an empty queue."""
    import sky
    import sky.jobs
    from sky import exceptions as sx

    from mncloud.backends.skypilot import cancel, find

    unknown = [424242]
    queue = sky.jobs.queue_v2(refresh=False, all_users=True, job_ids=unknown)
    for request_id, wait in (
        (queue, sky.get),
        (sky.jobs.queue_v2(refresh=False, all_users=False), sky.stream_and_get),
        (sky.jobs.cancel(job_ids=unknown), sky.get),
        (sky.jobs.cancel(name="contract-none"), sky.stream_and_get),
    ):
        with pytest.raises(sx.ClusterNotUpError, match=r"^No in-progress managed jobs\.$"):
            wait(request_id)
    assert _row(queue).name == "sky.jobs.queue_v2" and _row(queue).status == "FAILED"
    assert cancel.cancel_jobs(unknown) == [] and find.job_states(unknown) == {}
    assert cancel.live_job_ids("contract-none") == []
    assert find.jobs_named_exactly("contract-none") == []
    assert find.controller_state_uris("contract-none") == []
    assert find.launched_jobs("contract-none", "contract-run-0") == []


def test_the_user_each_process_is(side: Side, monkeypatch: pytest.MonkeyPatch) -> None:
    """`SKYPILOT_USER_ID` is who a process is: each request is that user's (the controller VM
    another user than the laptop); `api_info` of a plain server names no user and no auth, and
    says `external_proxy_auth_enabled` all the same: mncloud lets the controller launch."""
    import sky
    import sky.jobs
    from sky.server import constants as server_constants
    from sky.server.constants import MIN_API_ACCESS_API_VERSION
    from sky.utils import common_utils

    from mncloud.control.access import check_identity

    info = sky.api_info()
    assert info.status.value == "healthy" and info.user is None
    assert info.api_version == str(server_constants.API_VERSION)
    assert (info.version, info.commit) == (sky.__version__, sky.__commit__)
    assert not (info.basic_auth_enabled or info.ingress_basic_auth_enabled)
    assert not info.service_account_token_enabled
    assert info.external_proxy_auth_enabled  # SkyPilot's default, even with no proxy at all
    # ... which mncloud must not take for a login the controller's VM would lack:
    check_identity(info, "https://sky.example.com", {}, MIN_API_ACCESS_API_VERSION)

    def asked_by() -> str:
        request_id = sky.jobs.queue_v2(refresh=False)
        with pytest.raises(Exception):  # noqa: B017 (no jobs controller: see above)
            sky.get(request_id)
        row = _row(request_id)
        assert json.loads(row.request_body)["env_vars"]["SKYPILOT_USER_ID"] == row.user_id
        return str(row.user_id)

    assert common_utils.get_user_hash() == LAPTOP_ID == asked_by()
    monkeypatch.setenv("SKYPILOT_USER_ID", VM_ID)
    assert common_utils.get_user_hash() == VM_ID == asked_by()
    monkeypatch.setenv("SKYPILOT_USER_ID", LAPTOP_ID)
    assert asked_by() == LAPTOP_ID


def test_the_client_adds_its_endpoint_for_api_server_access(
    side: Side, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A task with `api_server_access` gets `SKYPILOT_API_SERVER_ENDPOINT` (the URL this client
    reaches the server at, a `user:password@` in it included) in the plain envs of the YAML
    sent; one without gets none."""
    import sky
    import yaml

    from mncloud.backends.skypilot.find import env_values

    def sent(run_id: str, access: bool) -> str:
        request_id = _launch(side, run_id, f"contract-{access}", access)
        task = json.loads(_row(request_id).request_body)["task"]
        sky.get(sky.api_cancel(request_id))
        return str(task)

    with_access, without = sent("contract-run-3", True), sent("contract-run-4", False)
    assert env_values(with_access, "SKYPILOT_API_SERVER_ENDPOINT") == {side.url}
    assert env_values(without, "SKYPILOT_API_SERVER_ENDPOINT") == set()
    assert env_values(without, RUN_ID_ENV) == {"contract-run-4"}
    assert [d.get("name") for d in yaml.safe_load_all(with_access)] == ["contract-True", "t"]

    with_password = side.url.replace("http://", "http://mn:pw-0417@")
    monkeypatch.setenv("SKYPILOT_API_SERVER_ENDPOINT", with_password)
    forget_server()
    plain = env_values(sent("contract-run-5", True), "SKYPILOT_API_SERVER_ENDPOINT")
    assert plain == {with_password}  # the password in plain envs: SkyPilot's client's doing
