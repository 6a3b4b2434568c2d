"""Credentials kept out of what a cloud deadline run writes down (issue #43 point 10), and the
refusals `up --deadline` makes before anything is launched (its "Bad input").

On `tests/fakesky/` with the helpers of `tests/test_control_cloud.py`: a basic-auth API endpoint
(`https://user:password@host`) and an `--env` value must not reach the controller's state in
the bucket, its records or SkyPilot's error text as mncloud keeps it.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from sky.jobs import ManagedJobStatus as S

from mncloud import control, layout
from mncloud.control.access import controller_access
from mncloud.records.store import list_records
from tests.fakesky import FakeSky
from tests.test_control_cloud import Driver, _fresh_vm, _named, _state
from tests.test_control_faults import _looks
from tests.test_skypilot import script  # noqa: F401 - a fixture

pytestmark = pytest.mark.catalog

PASSWORD = "s3cr3t-pw-9d1"
ENDPOINT = f"https://alice:{PASSWORD}@sky.example.com:46580"
ENV_VALUE = "plain-value-4417"
SSO = {"external_proxy_auth_enabled": True, "user": {"id": "ab12cd34", "name": "alice@example.com"}}
"""A server behind an auth proxy that logged the laptop in: the proxy names its user."""
SSO_AND_ACCOUNTS = {**SSO, "service_account_token_enabled": True}


def _bucket_state(tmp_path: Path) -> str:
    uri = layout.control_state_uri(f"file://{tmp_path / 'bucket'}/llm")
    return Path(uri.removeprefix("file://")).read_text()


@pytest.mark.slow
def test_the_bucket_state_keeps_no_password_and_no_env_value(
    script: Path,  # noqa: F811
    fake_sky: FakeSky,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """SkyPilot's error names the API server's URL (with its password); the controller's
    state keeps that text scrubbed, here and in the bucket, and the bucket copy names the
    `--env` values only. A controller VM restarted on a fresh home gets them back from its
    task's secret, and launches with them."""
    from sky import exceptions as sx

    run = Driver(_state(script, tmp_path, env=[f"NOTE={ENV_VALUE}"]))
    fake_sky.fail("jobs.launch", sx.ResourcesUnavailableError(f"no H100 at {ENDPOINT}"))
    _looks(run, 1)
    assert "sky.example.com" in run.state.detail and PASSWORD not in run.state.detail
    _looks(run, 1)
    (job,) = _named(fake_sky, "llm")
    fake_sky.set_status(job, S.RUNNING)
    _looks(run, 1)
    local = layout.control_state_file("llm").read_text()
    assert PASSWORD not in local and ENV_VALUE in local
    remote = _bucket_state(tmp_path)
    assert PASSWORD not in remote and ENV_VALUE not in remote and '"NOTE"' in remote
    for record in list_records("llm"):
        assert PASSWORD not in record.model_dump_json()

    fake_sky.reachable()
    access = controller_access(ENDPOINT, [], {}, {"NOTE": ENV_VALUE})
    for name, value in access.secrets.items():
        monkeypatch.setenv(name, value)
    state = _fresh_vm(monkeypatch, tmp_path, "vm2")
    assert state.spec["envs"]["NOTE"] == ENV_VALUE
    again = Driver(state, run.clock)
    again.clock.now += 5 * 3600  # past the 4 h deadline: an on-demand launch now
    _looks(again, 3, gap=1)
    (relaunched,) = fake_sky.live_jobs("llm")
    assert relaunched != job
    assert f"NOTE: {ENV_VALUE}" in fake_sky.job(relaunched).yaml
    assert ENV_VALUE not in _bucket_state(tmp_path)


def test_the_controller_task_carries_env_values_as_a_secret(tmp_path: Path) -> None:
    """The run's `--env` values reach the controller VM as one SkyPilot secret, never in its
    plain envs (which SkyPilot keeps in its job table)."""
    from mncloud.control.start import render_control_task

    state = _state_for_render(tmp_path)
    access = controller_access(ENDPOINT, [], {}, state.spec["envs"])
    text = render_control_task(state, ENDPOINT, access)
    assert ENV_VALUE not in text and PASSWORD not in text
    assert "MNCLOUD_RUN_ENVS: null" in text


def _state_for_render(tmp_path: Path) -> control.ControlState:
    from tests.test_control_job import _state as job_state

    state = job_state(tmp_path)
    state.spec = dict(state.spec, envs={"NOTE": ENV_VALUE})
    return state


# ------------------------------------------------------------------ refused at `up`


def test_an_api_server_that_would_not_know_the_controller_is_refused_at_up(
    script: Path,  # noqa: F811
    fake_sky: FakeSky,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Bad input: the server logs users in through an auth proxy and has no service accounts,
    the laptop no token: the controller VM could not call it. One line naming what is
    missing, exit 2, before any VM (nothing launched, no run state left behind)."""
    from tests.test_control_faults import _up_deadline

    fake_sky.health = dict(SSO)
    result = _up_deadline(monkeypatch, script, tmp_path)
    assert result.exit_code == 2 and "Traceback" not in result.output
    (line,) = result.stderr.strip().splitlines()
    assert "SKYPILOT_SERVICE_ACCOUNT_TOKEN" in line and "ENABLE_SERVICE_ACCOUNTS" in line
    assert fake_sky.jobs == {} and not fake_sky.called("jobs.launch")
    assert not layout.control_state_file("llm").exists()

    fake_sky.health["service_account_token_enabled"] = True  # SkyPilot gives it a token
    assert _up_deadline(monkeypatch, script, tmp_path).exit_code == 0
    assert _named(fake_sky, "llm-control") and not _named(fake_sky, "llm")


@pytest.mark.parametrize(
    ("health", "url", "token", "refused"),
    [
        ({}, "https://sky.example.com", None, False),
        ({"basic_auth_enabled": True}, "https://sky.example.com", None, True),
        ({"basic_auth_enabled": True}, ENDPOINT, None, False),
        ({"ingress_basic_auth_enabled": True}, ENDPOINT, None, False),
        ({"external_proxy_auth_enabled": True}, "https://sky.example.com", None, False),
        (SSO, ENDPOINT, None, True),
        (SSO, "https://sky.example.com", "sky_abc", False),
        ({**SSO_AND_ACCOUNTS, "api_version": "41"}, "https://sky.example.com", None, True),
        ({**SSO_AND_ACCOUNTS, "api_version": "42"}, "https://sky.example.com", None, False),
    ],
)
def test_which_logins_the_controller_would_have(
    health: dict[str, object], url: str, token: str | None, refused: bool
) -> None:
    from sky.schemas.api.responses import APIHealthResponse

    from mncloud.control.access import check_identity
    from mncloud.errors import SpecError

    info = APIHealthResponse(status="healthy", **health)  # type: ignore[arg-type]
    environ = {"SKYPILOT_SERVICE_ACCOUNT_TOKEN": token} if token else {}
    if not refused:
        check_identity(info, url, environ, min_api_version=42)
        return
    with pytest.raises(SpecError) as err:
        check_identity(info, url, environ, min_api_version=42)
    assert PASSWORD not in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize(
    ("url", "local"),
    [
        ("http://127.0.0.1:46580", True),
        ("http://127.0.1.1:46580", True),
        ("http://localhost:46580", True),
        ("http://LocalHost.:46580", True),
        ("http://api.localhost", True),
        ("http://[::1]:46580", True),
        ("http://[::ffff:127.0.0.1]:46580", True),
        ("http://0.0.0.0:46580", True),
        ("http://[::]:46580", True),
        ("http://169.254.169.254", True),
        ("http://mybox.local:46580", True),
        ("https://alice:pw@127.0.0.1", True),
        ("https://localhost-proxy.example.com", False),  # refused by the old substring test
        ("https://sky.example.com", False),
        ("http://10.0.3.7:46580", False),  # a VPC's: the controller may be beside it
        ("http://skypilot-api.skypilot.svc:80", False),
    ],
)
def test_the_api_server_check_refuses_what_no_cloud_vm_reaches(url: str, local: bool) -> None:
    from mncloud.control.access import on_this_machine_only

    assert on_this_machine_only(url) is local


def test_an_endpoint_password_never_reaches_the_controllers_plain_envs(
    script: Path,  # noqa: F811
    fake_sky: FakeSky,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """SkyPilot's client writes the URL it reaches the server at into the plain envs of a task
    with `api_server_access`, a `user:password@` included (held by tests/test_sky_contract.py).
    A controller whose endpoint has a password logs in with it from its secret: it launches
    without `api_server_access`, and its YAML (SkyPilot's job table) has no password. Where it
    would need SkyPilot's token for a proxy login, one line, exit 2, nothing launched."""
    import json

    import sky
    from click.testing import Result

    from mncloud.backends.skypilot.find import env_values
    from mncloud.cli import app
    from tests.test_control_faults import runner

    def up() -> Result:
        monkeypatch.chdir(script.parent)
        monkeypatch.setenv("MNCLOUD_HOME", str(tmp_path / "laptop"))
        monkeypatch.setenv("SKYPILOT_API_SERVER_ENDPOINT", ENDPOINT)
        args = ["up", "train.py", "--gpus", "H100:8", "--nodes", "4", "--name", "llm", "--yes",
                "--bucket", f"file://{tmp_path / 'bucket'}", "--deadline", "4h", "--hours", "2",
                "--spot-price", "10", "--on-demand-price", "30"]  # fmt: skip
        return runner.invoke(app, args)

    fake_sky.health = dict(SSO_AND_ACCOUNTS)
    refused = up()
    assert refused.exit_code == 2 and "Traceback" not in refused.output
    (line,) = refused.stderr.strip().splitlines()
    assert "password" in line and PASSWORD not in line and not fake_sky.jobs

    fake_sky.health = {}
    assert up().exit_code == 0
    (controller,) = _named(fake_sky, "llm-control")
    assert PASSWORD not in fake_sky.job(controller).yaml
    (launch,) = [r for r in sky.api_status(all_status=True) if r.name == "sky.jobs.launch"]
    sent = json.loads(launch.request_body)["task"]  # its secrets go to the server, as they must
    assert env_values(sent, "SKYPILOT_API_SERVER_ENDPOINT") == {"https://sky.example.com:46580"}
