"""The cloud fault soak's faults of issue #52 (`tests/cloudsoak.py` draws them with the rest).

    crash_in_launch   the controller killed while its launch request is held in flight; the
                      server finishes it later on its own; the controller restarted on a
                      fresh VM must wait for it and adopt its job (`find.wait_for_launch_
                      requests`, by the server's name `sky.jobs.launch`), not launch again
    second_user       the controller restarted as another API user (a VM with its own
                      identity): it must still see the jobs the first one launched
    cancel_error      `jobs.cancel` fails (the API server away) once or twice
    api_status_error  `sky.api_status` fails once or twice
    unauthorized      a 401 (`ApiServerAuthenticationError`, a token renewed late) once or
                      twice on the queue, a launch or a cancel
    server_failed     the server runs the next launch and fails it with a connection-type
                      error (the cloud's API unreachable from it): not a lost answer, and not
                      an error in the user's code
    controller_died   the controller's job FAILED_CONTROLLER while its training job trains:
                      `up --deadline --resume` must refuse (one line), never launch beside it;
                      then SkyPilot's controller is back (a new job) and the run goes on
    interrupted_up    another run's `up --deadline` cut short while its controller launch is
                      held in flight, then `up` again: refused; never two controllers
    long_up           `up --deadline 100h` where the controller could carry only the
                      laptop's own token (a server too old to give it one), which expires
                      in a day: refused in one line naming that token

Checks at the end (`final_checks`): the controller never gave up on a fault a second look
mends (`unsure.py`), and no launch SkyPilot failed was counted as an error in the user's code.
"""

from __future__ import annotations

import contextlib
import os
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from sky import exceptions as sx
from sky.jobs import ManagedJobStatus as S

from mncloud import control
from mncloud.errors import MncloudError, SpecError
from tests.fakesky import LAPTOP, FakeSky, User
from tests.test_control import GAP

NEW_FAULTS = ("crash_in_launch", "second_user", "cancel_error", "api_status_error",
              "unauthorized", "server_failed", "controller_died", "interrupted_up",
              "long_up")  # fmt: skip


class Crash(BaseException):
    """The controller dies here (a kill: nothing catches it)."""


@dataclass
class Soak:
    """What a fault may touch: the fake, the live controller (`run`), where homes go."""

    rng: random.Random
    fake: FakeSky
    run: Any
    """The controller on its VM (`tests.test_control_cloud.Driver`)."""
    monkeypatch: pytest.MonkeyPatch
    tmp_path: Path
    report: Any
    homes: list[tuple[str, float]] = field(default_factory=list)
    """Each controller VM's home and when it went."""
    n: int = 0
    vm_user: User | None = None
    """The controller VM's API user while a fault acts from the laptop."""


def apply(kind: str, s: Soak) -> None:
    """One of `NEW_FAULTS` on the soak's run (see the module docstring)."""
    if kind in ("crash_in_launch", "second_user"):
        _restart(s, crash=kind == "crash_in_launch")
    elif kind == "cancel_error":
        s.fake.fail("jobs.cancel", sx.ApiServerConnectionError(s.fake.server_url), _few(s))
    elif kind == "api_status_error":
        s.fake.fail("api_status", sx.ApiServerConnectionError(s.fake.server_url), _few(s))
    elif kind == "unauthorized":
        call = s.rng.choice(["jobs.queue_v2", "jobs.launch", "jobs.cancel"])
        s.fake.fail(call, sx.ApiServerAuthenticationError(s.fake.server_url), _few(s))
    elif kind == "server_failed":
        # A builtin: SkyPilot's wire gives the client the same type (a requests error arrives
        # as CloudError, which is no lost answer anyway).
        err = ConnectionRefusedError("the cloud's API is unreachable from the server")
        s.fake.fail("jobs.launch", err)
        _skypilot_lost_it(s)
    elif kind == "controller_died":
        _controller_died(s)
    elif kind == "interrupted_up":
        _interrupted_up(s)
    else:
        _long_up(s)


def _few(s: Soak) -> int:
    return s.rng.randint(1, 2)


def _skypilot_lost_it(s: Soak) -> None:
    """The live training job FAILED_CONTROLLER (SkyPilot's machinery): the controller
    relaunches at its next look."""
    for job in s.fake.live_jobs("llm"):
        if s.fake.job(job).tasks[0].status not in (S.CANCELLING,):
            s.fake.set_status(job, S.FAILED_CONTROLLER)


def _restart(s: Soak, *, crash: bool) -> None:
    """The controller restarted on a fresh VM: after a kill while its relaunch was held in
    flight (`crash`), or as another API user."""
    if crash:
        _killed_launching(s, finish_after=s.rng.randint(1, 6))
    else:
        s.fake.as_user(User(f"controller-vm-{s.n}", f"c0{s.n:06x}"))
    s.homes.append((os.environ["MNCLOUD_HOME"], s.run.clock.now))  # that VM went now
    _on_fresh_vm(s)


def _killed_launching(s: Soak, finish_after: int | None, looks: int = 6, gap: float = 60.0) -> bool:
    """The training job lost (SkyPilot's), the controller's relaunch sent and held in flight,
    the controller killed before its answer (a backoff may come first: `looks` looks `gap`
    apart at most); the server finishes the request after `finish_after` later requests
    (None: when told). Whether it was killed so (else it launched nothing in those looks)."""
    import sky

    fake, killed = s.fake, False
    _skypilot_lost_it(s)
    fake.held.add("jobs.launch")
    fake.finish_after = finish_after
    sent = sky.jobs.launch

    def sent_then_killed(*args: Any, **kwargs: Any) -> Any:
        request_id = sent(*args, **kwargs)
        if kwargs.get("name") == "llm":
            raise Crash
        return request_id

    with s.monkeypatch.context() as patch:
        patch.setattr(sky.jobs, "launch", sent_then_killed)
        try:
            for _ in range(looks):  # its next launch: a backoff may come first
                s.run.ctl.look()
                s.run.clock.now += gap
        except Crash:
            killed = True
    fake.held.discard("jobs.launch")
    return killed


def _on_fresh_vm(s: Soak, key: str | None = None) -> None:
    """The controller (re)started on a fresh VM: an empty home, the state from the bucket; its
    recovery as `Controller.run` makes it: LaunchUnknown ends the process and SkyPilot restarts
    it a minute later (a few times here), another error is a look's (`unsure.py`). `key`: a new
    controller job's hand-off key ("": one `up` launched; None: the restarted job's own)."""
    from mncloud.control.handoff import HANDOFF_ENV
    from mncloud.control.recovery import LaunchUnknown
    from tests.test_control_cloud import Driver, _fresh_vm

    if key is not None:  # (not a successor's left in the environment by a hand-off before)
        s.monkeypatch.setenv(HANDOFF_ENV, key)
    fresh = _fresh_vm(s.monkeypatch, s.tmp_path, f"vm-{s.report.seed}-{s.n}")
    s.run = Driver(fresh, s.run.clock)
    for _restart in range(5):
        try:
            s.run.ctl._recover()
        except LaunchUnknown:
            s.run.clock.now += 60.0
            continue
        except MncloudError:
            pass
        break


def _from_laptop(s: Soak, **update: Any) -> control.ControlState:
    """The run's `up --deadline` again from another laptop (its own home, the laptop's API
    user), as `update` says; `_back_on_vm` returns to the controller's VM."""
    st = s.run.state
    if s.vm_user is None:  # (twice in one fault: the VM's user kept from the first)
        s.vm_user = s.fake.user
    s.fake.as_user(LAPTOP)
    s.monkeypatch.setenv("MNCLOUD_HOME", str(s.tmp_path / f"laptop-{s.report.seed}-{s.n}"))
    fields = {"name": st.name, "config": st.config, "spec": st.spec, "options": st.options}
    return control.ControlState(**{**fields, **update})


def _back_on_vm(s: Soak, home: str) -> None:
    """Back from `_from_laptop`: the controller VM's home and API user."""
    s.monkeypatch.setenv("MNCLOUD_HOME", home)
    if s.vm_user is not None:
        s.fake.as_user(s.vm_user)
    s.vm_user = None


def _controller_died(s: Soak) -> None:
    """The controller's job FAILED_CONTROLLER while a training job it steers trains (once one
    does: `_trains`): `up --resume` refused in one line; nothing launched beside it. Then the
    controller is back."""
    from mncloud.control.start import start
    from tests.cloudsoak import _controller_job

    fake, st = s.fake, s.run.state
    steered = _trains(s)
    training, controllers = fake.live_jobs("llm"), fake.live_jobs("llm-control")
    if not controllers or steered is None or st.final:
        return
    for job in controllers:  # (a state restarted from the bucket may not name it)
        fake.set_status(job, S.FAILED_CONTROLLER)
    home, jobs = os.environ["MNCLOUD_HOME"], len(fake.jobs)
    try:
        for _attempt in range(5):  # the API server away says so; the user runs it again
            try:
                start(_from_laptop(s, existing="resume"))
            except SpecError as err:
                said = str(err)
                if "\n" in said or "mncloud down llm" not in said or str(steered) not in said:
                    s.report.violations.append(f"fault {s.n}: --resume refused as {said!r}")
            except MncloudError:
                continue
            else:
                s.report.violations.append(f"fault {s.n}: --resume beside job {training} accepted")
            break
    finally:
        _back_on_vm(s, home)
    if len(fake.jobs) != jobs:
        s.report.violations.append(f"fault {s.n}: a resume beside job {training} launched")
    _controller_job(fake, s.monkeypatch, st)  # SkyPilot's controller back (a new job)


def _trains(s: Soak, rounds: int = 4) -> int | None:
    """The job of the live launch of the controller holding the run (`s.run`), training: looks
    a tick apart until that launch is live and steered (`cloudsoak.until_steered`: nothing of
    it journaled half done), the cloud giving it its VMs where it waits for them; a job with a
    task being cancelled only ends (a `--resume` finds it over), so the looks go on past it.
    None: the run ended, or no such job within `rounds` of those looks."""
    from tests.cloudsoak import until_steered

    fake, run = s.fake, s.run
    for _ in range(rounds):
        until_steered(fake, run)
        st = run.state
        if st.final:
            return None
        half_done = st.closing is not None or st.launching is not None
        steers = st.live.job_ids if st.live is not None and not half_done else []
        for job in (j for j in fake.live_jobs("llm") if j in steers):
            if _vms_given(fake, job):
                return job
        run.ctl.look()
        run.clock.now += GAP
    return None


def _vms_given(fake: FakeSky, job: int) -> bool:
    """Whether `job` trains: every task SkyPilot has not ended RUNNING, once the cloud gives
    those waiting for VMs theirs; never one with a task being cancelled (it only ends)."""
    from tests.cloudsoak import _FROM, _set_live

    unended = [t.status for t in fake.job(job).tasks if not t.status.is_terminal()]
    if not unended or S.CANCELLING in unended:
        return False
    if all(status in (S.RUNNING, *_FROM["recovered"]) for status in unended):
        _set_live(fake, job, S.RUNNING)
    return all(t.status is S.RUNNING for t in fake.job(job).tasks if not t.status.is_terminal())


def _interrupted_up(s: Soak) -> None:
    """Another run's `up --deadline` cut short (Ctrl-C) while its controller's launch is held
    in flight, then `up` again: refused; never two controllers. That run is then taken away."""
    from mncloud.backends.skypilot import host
    from mncloud.control.start import start

    fake, st = s.fake, s.run.state
    uri = str(st.config.state_uri).replace("/llm/", "/llm-b/")
    other = {"name": "llm-b", "config": st.config.model_copy(update={"state_uri": uri}),
             "existing": "resume"}  # fmt: skip

    sent: list[str] = []

    def sent_then_interrupted(_self: Any, run_name: str, config: Any, secrets: Any) -> None:
        import sky

        sent.append(sky.jobs.launch(sky.Task.from_yaml_config(config), name=f"{run_name}-control"))
        raise KeyboardInterrupt

    home = os.environ["MNCLOUD_HOME"]
    fake.held.add("jobs.launch")
    try:
        with s.monkeypatch.context() as patch:
            patch.setattr(host.SkyPilotHost, "launch_controller", sent_then_interrupted)
            for _attempt in range(5):  # an API error before the launch: the user runs it again
                with contextlib.suppress(KeyboardInterrupt, MncloudError):
                    start(_from_laptop(s, **other))
                if sent:
                    break
        fake.held.discard("jobs.launch")
        for _attempt in range(5):  # the API server away says so; the user runs it again
            try:
                start(_from_laptop(s, **other))
            except SpecError:
                break
            except MncloudError:
                continue
            s.report.violations.append(f"fault {s.n}: up after an interrupted up not refused")
            break
    finally:
        fake.held.discard("jobs.launch")
        _back_on_vm(s, home)
    fake.finish_in_flight()
    made = fake.live_jobs("llm-b-control")
    if len(made) > 1:
        s.report.violations.append(f"fault {s.n}: two controllers {made} of an interrupted up")
    for job in made:  # that run's `down`: not this soak's run
        fake.set_status(job, S.CANCELLED)


def _long_up(s: Soak) -> None:
    """`up --deadline 100h` where the controller could carry only the laptop's own token (a
    server too old to give it one), which expires in a day, as would a successor's: refused,
    one line naming that token, before anything else is asked. (Where SkyPilot gives the
    controller its token, it hands off and a long deadline is fine: test_control_handoff.py.)"""
    from sky.server import constants as server_constants

    from mncloud.control.access import TOKEN_ENV
    from mncloud.control.start import start

    fake = s.fake
    fake.health = {"api_version": str(int(server_constants.MIN_API_ACCESS_API_VERSION) - 1)}
    config = s.run.state.config.model_copy(update={"deadline_s": 100 * 3600.0})
    home, jobs, token = os.environ["MNCLOUD_HOME"], len(fake.jobs), os.environ.get(TOKEN_ENV)
    s.monkeypatch.setenv(TOKEN_ENV, fake.issue_token(fake.user, days=1))
    try:
        start(_from_laptop(s, config=config, existing="resume"))
        s.report.violations.append(f"fault {s.n}: a 100 h deadline accepted")
    except MncloudError as err:
        if TOKEN_ENV not in str(err) or "expires in" not in str(err) or "\n" in str(err):
            s.report.violations.append(f"fault {s.n}: a 100 h deadline refused as {err}")
    finally:
        fake.health = {}
        _back_on_vm(s, home)
        if token is None:
            s.monkeypatch.delenv(TOKEN_ENV)
        else:
            s.monkeypatch.setenv(TOKEN_ENV, token)
    if len(fake.jobs) != jobs:
        s.report.violations.append(f"fault {s.n}: a 100 h deadline launched something")


def final_checks(s: Soak) -> None:
    """The controller never gave up on faults a look again mends; no launch SkyPilot failed
    counted as an error in the user's code (only `node_failed` is one)."""
    st, report = s.run.state, s.report
    if st.phase == "failed" and "controller stopped" in (st.detail or ""):
        report.violations.append(f"the controller gave up on a passing fault: {st.detail}")
    users = report.faults.get("node_failed", 0)
    if st.errors_retried > users:
        report.violations.append(
            f"{st.errors_retried} launches counted as errors in your code, {users} were"
        )
