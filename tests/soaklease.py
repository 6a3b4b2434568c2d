"""The cloud fault soak's lease faults (issue #58; `tests/cloudsoak.py` draws them with the
rest): the deadline controller killed while its training launch is held in flight at the API
server, its job then FAILED past its restarts, and `up --deadline --resume` from the laptop.

    dead_in_launch  the laptop sees that request (`sky.api_status`): the `up` waits for it
                    (`lease.pause`, on the soak's clock; the server finishes it meanwhile)
                    and cancels the job it made, never steered (`control/lease.py`)
    dead_unseen     the server's logins on (`fakesky/auth.py`): the dead controller a
                    service account, the laptop another user, an admin shown that request's
                    body as `null` or a non-admin not shown it at all: the `up` cannot tell
                    it is the run's and goes on; the server finishes it afterwards, and the
                    new controller, whose state keeps the old run ids, cancels its job before
                    it launches (`recovery.earlier_launches`)

The new controller's VM comes up 7–15 minutes after the `up`. After `dead_in_launch` the cloud
gives whatever training job is live its VMs meanwhile: one the `up` left (it did not wait)
trains unsteered and unbilled until the new controller cancels it. After `dead_unseen` that
job still waits for its VMs: no `up` can see it, so until the new controller is up nobody can
cancel it, and none bills it (a gap of the product, not what this fault checks).

Checks: `--resume` refused only beside a training job its controller steered, or beside the
controller an earlier try of that `up` launched (its answer lost, the user ran it again);
then the soak's own (one live training job after every look, the ledger billing what ran).
"""

from __future__ import annotations

import contextlib
import os
from collections import deque
from collections.abc import Iterator

from sky.jobs import ManagedJobStatus as S

from mncloud.control import lease
from mncloud.errors import MncloudError, SpecError
from tests.fakesky import LAPTOP, FakeSky
from tests.soakfaults import Soak, _back_on_vm, _from_laptop, _killed_launching, _on_fresh_vm
from tests.test_control import GAP

LEASE_FAULTS = ("dead_in_launch", "dead_unseen")
VM_UP_S = (420.0, 600.0, 900.0)
"""How long after the `up` the new controller's VM comes up."""
KILL_LOOKS = 12
"""Looks, a decision apart, for the controller's next training launch (the one it dies in):
a controller whose policy waits (ahead of its schedule, no capacity) may launch an hour on."""


def lease_fault(kind: str, s: Soak) -> None:
    """One of `LEASE_FAULTS` (see the module docstring); nothing while no controller runs."""
    from mncloud.control.access import TOKEN_ENV

    fake, rng = s.fake, s.rng
    if s.run.state.final or not fake.live_jobs("llm-control"):
        return
    unseen, token = kind == "dead_unseen", os.environ.get(TOKEN_ENV)
    laptop = _logins_on(s) if unseen else None
    try:
        with _goes_through(fake):
            killed = _killed_launching(s, finish_after=None, looks=KILL_LOOKS, gap=GAP)
        if not killed:
            return
        s.homes.append((os.environ["MNCLOUD_HOME"], s.run.clock.now))  # its VM went with it
        for job in fake.live_jobs("llm-control"):
            fake.set_status(job, S.FAILED_CONTROLLER)
        if laptop is not None:
            s.monkeypatch.setenv(TOKEN_ENV, laptop)
        made = _resume(s, finish_s=rng.choice([1, 3, 12]) * lease.LAUNCH_POLL_S)
    finally:
        fake.admins.discard(LAPTOP.user_hash)
        if token is None:
            s.monkeypatch.delenv(TOKEN_ENV, raising=False)
        else:
            s.monkeypatch.setenv(TOKEN_ENV, token)
    fake.finish_in_flight()  # whatever the server still held, it finishes now
    for job in fake.live_jobs("llm") if not unseen else []:  # the cloud gives it its VMs
        if fake.job(job).tasks[0].status in (S.PENDING, S.STARTING):
            fake.set_status(job, S.RUNNING)
    s.run.clock.now += rng.choice(VM_UP_S)
    if made:  # the new controller: its first look, checked as every look is
        from tests.cloudsoak import _look

        _on_fresh_vm(s, key="")  # the controller `up` launched
        _look(s.run, fake, s.report, 60.0)
    else:  # refused: SkyPilot's controller back (a new job), as after `controller_died`
        from tests.cloudsoak import _controller_job

        _controller_job(fake, s.monkeypatch, s.run.state)


@contextlib.contextmanager
def _goes_through(fake: FakeSky) -> Iterator[None]:
    """The launch the controller dies in goes through at the server (its premise): failures
    drawn for `jobs.launch` (a 401, the server's own) wait for the launches after it."""
    drawn = fake._failing.pop("jobs.launch", None)
    try:
        yield
    finally:
        if drawn:
            fake._failing.setdefault("jobs.launch", deque()).extendleft(reversed(drawn))


def _logins_on(s: Soak) -> str:
    """The server's logins on: the controller VM's user a service account (its token in the
    environment, for the launch it dies in), the laptop another, an admin or not; the
    laptop's token."""
    from mncloud.control.access import TOKEN_ENV

    fake = s.fake
    s.monkeypatch.setenv(TOKEN_ENV, fake.issue_token(fake.user, days=None))
    laptop = fake.issue_token(LAPTOP, days=None)
    if s.rng.random() < 0.5:  # shown the request with a null body, else not at all
        fake.admins.add(LAPTOP.user_hash)
    return laptop


def _resume(s: Soak, finish_s: float) -> list[int]:
    """`up --deadline --resume` from the laptop, run again while it says it could not finish,
    the server finishing the request in flight once the `up` waited `finish_s` for it; the
    controllers it launched."""
    from mncloud.control.start import start

    fake, waited = s.fake, [0.0]
    before = set(fake.live_jobs("llm-control"))

    def pause(seconds: float) -> None:  # the `up`'s wait, on the soak's clock
        waited[0] += seconds
        s.run.clock.now += seconds
        if waited[0] >= finish_s:
            fake.finish_in_flight()

    home = os.environ["MNCLOUD_HOME"]
    try:
        with s.monkeypatch.context() as patch:
            patch.setattr(lease, "pause", pause)
            for _attempt in range(5):
                try:
                    start(_from_laptop(s, existing="resume"))
                except SpecError as err:  # only beside a job it steered, or its own controller
                    launched = set(fake.live_jobs("llm-control")) - before
                    if not _steered(s) and not launched:
                        s.report.violations.append(f"fault {s.n}: --resume refused: {err}")
                except MncloudError:  # the API server away, an answer lost: the user runs it again
                    continue
                break
    finally:
        _back_on_vm(s, home)
    return [job for job in fake.live_jobs("llm-control") if job not in before]


def _steered(s: Soak) -> bool:
    """Whether a live training job of the run is one its controller recorded (steered)."""
    st = s.run.state
    recorded = {*st.job_ids, *(st.live.job_ids if st.live is not None else [])}
    return any(job in recorded for job in s.fake.live_jobs("llm"))
