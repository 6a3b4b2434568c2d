"""The cloud deadline controller as a SkyPilot managed job: restarted when its process crashes,
never when it ended on purpose.

Two halves of one contract: the rendered task asks SkyPilot for `max_restarts_on_errors`
(SkyPilot restarts a job whose process exits non-zero), and `mncloud control` exits 0 only when
it is done (the run ended, or `down` stopped it), non-zero when it crashed, with its state left
for the restarted controller to resume. Both in-process: the command as the template runs it
(`--state-uri`, the state in a `file://` bucket), through Typer's CliRunner.
"""

from __future__ import annotations

import copy
import logging
import signal
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from mncloud import layout
from mncloud.cli import app
from mncloud.control.loop import Controller
from mncloud.control.start import CONTROL_MAX_RESTARTS, CONTROL_RECOVERY, render_control_task
from mncloud.control.state import (
    ControlConfig,
    ControlState,
    load_uri,
    request_stop,
    save_state,
)
from mncloud.errors import SpecError
from mncloud.request import build_spec
from mncloud.spec.launch import LaunchOptions

runner = CliRunner()


def _state(tmp_path: Path, state_uri: str | None = None) -> ControlState:
    """A cloud (SkyPilot) deadline run's first controller state."""
    workdir = tmp_path / "proj"
    workdir.mkdir(exist_ok=True)
    (workdir / "train.py").write_text("pass\n")
    spec = build_spec(workdir / "train.py", gpus="cpu:1", nodes=2, cloud=["local"], name="dl")
    config = ControlConfig(
        backend="skypilot", nodes=2, hours=1, deadline_s=3 * 3600, spot_price=1.0,
        on_demand_price=3.0, gap_s=300, overhead_s=600,
        state_uri=state_uri or "s3://team-ckpt/dl/control/state.json",
    )  # fmt: skip
    return ControlState(
        name="dl",
        config=config,
        spec=spec.model_dump(mode="json"),
        options=LaunchOptions(hours=1).model_dump(mode="json"),
    )


def test_the_controller_task_restarts_a_crashed_controller(tmp_path: Path) -> None:
    """`resources.job_recovery`: FAILOVER (a crashed controller runs again on its own VM
    first) and `max_restarts_on_errors`, bounded, in a task SkyPilot itself accepts (its
    schema, `Task.from_yaml_config`, its registry of strategies)."""
    import sky
    from sky.utils import common_utils, registry, schemas

    from mncloud.render import validate_task_config

    config = yaml.safe_load(render_control_task(_state(tmp_path), "https://sky.example.com"))
    assert config["resources"]["job_recovery"] == {
        "strategy": "FAILOVER", "max_restarts_on_errors": CONTROL_MAX_RESTARTS,
    }  # fmt: skip
    assert CONTROL_RECOVERY == "FAILOVER"
    assert 1 <= CONTROL_MAX_RESTARTS <= 100
    assert config["resources"]["use_spot"] is False
    validate_task_config(config)
    common_utils.validate_schema(config, schemas.get_task_schema(), "")
    task = sky.Task.from_yaml_config(copy.deepcopy(config))
    recovery = next(iter(task.resources)).job_recovery
    assert recovery is not None
    assert recovery["max_restarts_on_errors"] == CONTROL_MAX_RESTARTS
    assert recovery["strategy"] == "FAILOVER"
    assert registry.JOBS_RECOVERY_STRATEGY_REGISTRY.from_str(recovery["strategy"]) is not None
    # The process SkyPilot watches is the controller itself: its exit status is the job's.
    assert "exec python -m mncloud control dl" in config["run"]


@pytest.fixture
def cloud_state(tmp_path: Path) -> tuple[ControlState, str]:
    """A cloud controller's state saved in a `file://` bucket, as `up --deadline` leaves it."""
    uri = layout.control_state_uri(f"file://{tmp_path / 'bucket'}/dl")
    state = _state(tmp_path, uri)
    save_state(state)
    return state, uri


def _control(uri: str, tmp_path: Path) -> Any:
    """`mncloud control` as the template runs it, in-process; it leaves the process's logging
    and SIGTERM handler as they were (its log handler is bound to the runner's stderr)."""
    logger = logging.getLogger("mncloud")
    before = (list(logger.handlers), logger.level, logger.propagate)
    sigterm = signal.getsignal(signal.SIGTERM)
    result = runner.invoke(app, ["control", "dl", "--state-uri", uri, "--workdir", str(tmp_path)])
    assert (list(logger.handlers), logger.level, logger.propagate) == before
    assert signal.getsignal(signal.SIGTERM) == sigterm
    return result


def test_a_crash_exits_non_zero_and_leaves_the_state_to_resume(
    cloud_state: tuple[ControlState, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _state0, uri = cloud_state

    def bug(self: Controller) -> None:
        raise KeyError("a bug in a decision")

    with monkeypatch.context() as patched:
        patched.setattr(Controller, "step", bug)
        result = _control(uri, tmp_path)
    assert result.exit_code == 1, result.output
    assert "crashed" in result.output and "KeyError" in result.output  # the traceback, logged
    left = load_uri(uri)
    assert left is not None and not left.final and left.started_at is not None

    # SkyPilot restarts it: the new controller resumes that state (and here `down` stopped
    # the run meanwhile): a clean stop exits 0, so SkyPilot does not restart it again.
    request_stop("dl", 0.0)
    result = _control(uri, tmp_path)
    assert result.exit_code == 0, result.output
    done = load_uri(uri)
    assert done is not None and done.phase == "stopped" and done.resumes == 1
    assert "stopped by mncloud down" in done.detail


def test_a_controller_started_on_a_final_state_exits_0(
    cloud_state: tuple[ControlState, str], tmp_path: Path
) -> None:
    """A restart after the run ended (or a crash after the final state was written) does
    nothing and exits 0: SkyPilot's restarts stop there."""
    state, uri = cloud_state
    state.phase, state.detail = "finished", "the run finished"
    save_state(state)
    result = _control(uri, tmp_path)
    assert result.exit_code == 0, result.output
    assert "already finished" in result.output


def test_a_refusal_is_final_and_exits_0(
    cloud_state: tuple[ControlState, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A refusal in the loop (a spec SkyPilot will never accept, FAILED_PRECHECKS) ends the
    run as `failed`, in its state: the controller is done, and a restart would change
    nothing. Any other error is "unsure, look again" (`control/unsure.py`; issue #43 point 1,
    tests/test_control_cloud.py), never a final failure on the first look."""
    _state0, uri = cloud_state

    def refused(self: Controller) -> None:
        raise SpecError("the launch was refused")

    monkeypatch.setattr(Controller, "step", refused)
    result = _control(uri, tmp_path)
    assert result.exit_code == 0, result.output
    final = load_uri(uri)
    assert final is not None and final.phase == "failed"
    assert "the launch was refused" in final.detail


def test_no_state_to_start_from_exits_non_zero(tmp_path: Path) -> None:
    """The state missing or unreadable (a bucket unreachable): one line, exit 2, so SkyPilot
    tries again (at most `CONTROL_MAX_RESTARTS` times)."""
    uri = layout.control_state_uri(f"file://{tmp_path / 'empty'}/dl")
    result = _control(uri, tmp_path)
    assert result.exit_code == 2
    assert "no controller state" in result.output


def test_an_api_error_is_not_a_refusal_but_failed_prechecks_is() -> None:
    from mncloud.control.unsure import is_refusal
    from mncloud.errors import BackendError

    assert not is_refusal(BackendError("cannot launch: SkyPilot's API server is unreachable"))
    assert not is_refusal(BackendError("cannot launch: SkyPilot wants a login; `sky api login`"))
    assert is_refusal(BackendError("managed job 4: FAILED_PRECHECKS; no such GPU"))
    assert is_refusal(SpecError("--gpus H100:9: no such shape"))


def test_the_controller_gets_secrets_as_secrets_and_no_password_in_plain_sight(
    tmp_path: Path,
) -> None:
    """Issue #43 points 8, 10: the run's `--secret` values and a basic-auth API endpoint
    reach the controller VM through SkyPilot's `secrets`, never its plain `envs`; the
    bucket's endpoint is carried; the controller asks for its API token on purpose (unless its
    endpoint's password is its login)."""
    import sky

    from mncloud.control.access import controller_access

    state = _state(tmp_path)
    state.spec["secrets"] = ["HF_TOKEN"]
    url = "https://alice:s3cr3t-pw@sky.example.com:46580"
    environ = {"HF_TOKEN": "hf_abc123", "AWS_ENDPOINT_URL": "https://s3.example.org"}
    access = controller_access(url, ["HF_TOKEN"], environ)
    text = render_control_task(state, url, access)
    assert "s3cr3t-pw" not in text and "hf_abc123" not in text
    config = yaml.safe_load(text)
    # its login is the password (a secret): with api_server_access, SkyPilot's client would
    # write the URL into its plain envs (tests/test_control_credentials.py)
    assert config["api_server_access"] is False
    assert config["envs"]["SKYPILOT_API_SERVER_ENDPOINT"] == "https://sky.example.com:46580"
    plain = "https://sky.example.com:46580"
    again = render_control_task(state, plain, controller_access(plain, ["HF_TOKEN"], environ))
    assert yaml.safe_load(again)["api_server_access"] is True  # SkyPilot's token, on purpose
    assert config["envs"]["AWS_ENDPOINT_URL"] == "https://s3.example.org"
    assert set(config["secrets"]) == {"HF_TOKEN", "SKYPILOT_API_SERVER_ENDPOINT"}
    task = sky.Task.from_yaml_config(config, secrets_overrides=list(access.secrets.items()))
    values = {k: getattr(v, "get_secret_value", lambda v=v: v)() for k, v in task.secrets.items()}
    assert values == {"HF_TOKEN": "hf_abc123", "SKYPILOT_API_SERVER_ENDPOINT": url}
    assert "s3cr3t-pw" not in str(task.envs)


def test_a_secret_missing_here_fails_up_before_any_vm(tmp_path: Path) -> None:
    from mncloud.control.access import controller_access

    with pytest.raises(SpecError, match="secret HF_TOKEN is not set") as err:
        controller_access("https://sky.example.com", ["HF_TOKEN"], {})
    assert "\n" not in str(err.value)
