"""The cloud fault soak's token faults (issue #58): the controller's SkyPilot API token near its
expiry, the hand-off to a fresh controller job, and what goes wrong around it.

Where SkyPilot's API server has service accounts, each controller job carries a token of its
launching user that expires in 3 days (`mncloud/control/horizon.py`, `handoff.py`); the soak's
clock ends long before. So each fault starts with the fake re-issuing the controller VM's
token to expire a few hours ahead, as if the run had gone on for 65 h: the server has service
accounts from then on and, for the fault, is reached without a password, so that SkyPilot
gives each controller job it launches a token of its own (`tests/fakesky/tokens.py`); the
run's config says it hands off, as `up` writes it there. Each controller job is a `VM` (its
home, its token, its hand-off key) on the soak's clock:

    handoff     the controller launches its successor job; SkyPilot keeps it PENDING a few
                looks; SkyPilot fails the training job and the answer to the relaunch is lost
                (a launch journaled at hand-off time); the successor runs, waits, is handed
                the run and steers; then SkyPilot restarts the old controller (a crash before
                its exit), which must touch nothing. The soak goes on with the successor.
    token_stop  the successor never gets its VM: the run is stopped at a checkpoint before
                the controller's token expires; then `up --deadline --resume` from the laptop
                (a new controller job, a fresh token), with which the soak goes on.
    blind       the controller's VM stalls, while a job it steers trains, from before its
                stop point to past its token's expiry: its next look makes no call, its state
                naming `mncloud down`; the laptop's `down`, then `up --resume`, and the soak
                goes on.

Invariants beside each look's (`cloudsoak._look`): no call answered 401 for an expired token
(`fake.refused`); a controller whose key the run's state in the bucket does not name neither
launches, cancels nor writes that state (one controller steers); the controller holding the
run never reaches its token's expiry (stopped or handed off before). After a fault the token
of the controller that goes on, which outlives the soak, is no longer sent: later faults pick
the API user with `as_user`, which a token would override.

On a job group's run (`--recovery node`, the controller-group soak) too, since 2 December: the
ledger check had reported seconds billed past what the VMs ran there, a record no later home
closed (now `billing.close_earlier`); its control with these faults in finds nothing in 10
seeds of 12 and of 20 faults. The +390 s the long form's control reported (a holder's launch
no look of it saw, left open at its hand-off) is `soakledger._superseded`'s. A launch its
`blind` controller last saw waiting, then recovered and ran until the laptop's `down`
cancelled it, was once billed by no home (-7457 s): `down` now closes every launch's record
from the bucket's copy (`billing.close_downed`).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TypeVar

import yaml
from sky.jobs import ManagedJobStatus as S

from mncloud import control
from mncloud.control.access import TOKEN_ENV, TOKEN_MARGIN_S, redact_url
from mncloud.control.handoff import HANDOFF_ENV, HANDOFF_MARGIN_S, RETRY_S
from mncloud.control.horizon import token_ends
from mncloud.errors import MncloudError
from tests.fakesky import FakeSky
from tests.soakfaults import Soak, _back_on_vm, _from_laptop
from tests.test_control import GAP
from tests.test_control_cloud import Driver, _fresh_vm

TOKEN_FAULTS = ("handoff", "token_stop", "blind")
T = TypeVar("T")
_WAITING = (S.PENDING, S.STARTING, S.RECOVERING)
_STEERS = ("jobs.launch", "jobs.cancel")
"""Calls only the controller holding the run makes."""


@dataclass
class VM:
    """One controller job on its own VM."""

    run: Driver
    home: str
    key: str
    """Its `MNCLOUD_HANDOFF_KEY` ("": the controller `up` launched)."""
    job_id: int | None
    token: str | None = None
    """The SkyPilot token its job carries (None: none)."""


def token_fault(kind: str, s: Soak) -> None:
    """One of `TOKEN_FAULTS` on the soak's run (see the module docstring)."""
    from sky.server import common as server_common

    from tests.cloudsoak import ENDPOINT

    if s.run.state.final:
        return
    s.monkeypatch.delenv(TOKEN_ENV, raising=False)  # (put back as it was at the soak's end)
    s.monkeypatch.setenv(HANDOFF_ENV, os.environ.get(HANDOFF_ENV, ""))
    st = s.run.state
    job = st.controller_job_id or next(iter(s.fake.live_jobs(f"{st.name}-control")), None)
    holder = VM(s.run, os.environ["MNCLOUD_HOME"], s.run.ctl.handoff_key, job)
    refused = len(s.fake.refused)
    with s.monkeypatch.context() as patch:
        patch.setattr(server_common, "get_server_url", lambda host=None: redact_url(ENDPOINT))
        if kind == "handoff":
            after = _handoff(s, holder)
        elif kind == "token_stop":
            after = _token_stop(s, holder)
        else:
            after = _blind(s, holder)
    if s.fake.refused[refused:]:
        s.report.violations.append(f"fault {s.n}: calls with an expired token {s.fake.refused}")
    s.run = after.run  # whichever controller holds the run now
    s.monkeypatch.setenv("MNCLOUD_HOME", after.home)
    s.monkeypatch.setenv(HANDOFF_ENV, after.key)
    os.environ.pop(TOKEN_ENV, None)


@contextlib.contextmanager
def _on(vm: VM) -> Iterator[None]:
    """`vm`'s process environment while it runs."""
    names = (TOKEN_ENV, HANDOFF_ENV, "MNCLOUD_HOME")
    before = {name: os.environ.get(name) for name in names}
    _setenv(TOKEN_ENV, vm.token)
    _setenv(HANDOFF_ENV, vm.key)
    _setenv("MNCLOUD_HOME", vm.home)
    try:
        yield
    finally:
        for name, value in before.items():
            _setenv(name, value)


def _setenv(name: str, value: str | None) -> None:
    if value is None:
        os.environ.pop(name, None)
    else:
        os.environ[name] = value


def _arm(s: Soak, vm: VM, expires_in: float) -> float:
    """The token `vm`'s job carries, re-issued to expire `expires_in` from now; when."""
    vm.token = s.fake.issue_token(s.fake.user, days=expires_in / 86400)
    st = vm.run.state
    st.config = st.config.model_copy(update={"hands_off": True})  # as `up` found the server
    with _on(vm):
        vm.run.ctl.token_ends = token_ends(vm.run.ctl.backend)
    assert vm.run.ctl.token_ends is not None
    return vm.run.ctl.token_ends


def _vm(s: Soak, name: str, key: str, job_id: int | None) -> VM:
    """A controller job SkyPilot starts on a fresh VM: its state from the bucket, the token
    SkyPilot gave its job."""
    token = s.fake.job_tokens.get(job_id) if job_id is not None else None
    home = str(s.tmp_path / f"vm-{s.report.seed}-{s.n}-{name}")
    vm = VM(s.run, home, key, job_id, token)
    with _on(vm):
        vm.run = Driver(_fresh_vm(s.monkeypatch, s.tmp_path, os.path.basename(home)), s.run.clock)
    return vm


def _look_as(s: Soak, vm: VM, gap: float) -> None:
    """One look of `vm` (`cloudsoak._look`), then: none of its calls refused; when the run's
    state in the bucket named another key before it, no launch, no cancel, no write of it."""
    from tests.cloudsoak import _look

    fake, uri = s.fake, vm.run.state.config.state_uri or ""
    before = control.load_uri(uri)
    calls, refused = len(fake.calls), len(fake.refused)
    with _on(vm):
        try:
            _look(vm.run, fake, s.report, gap)
        except MncloudError:  # LaunchUnknown: it exits non-zero, SkyPilot restarts it
            vm.run.clock.now += gap
            stored = control.load_uri(uri)
            assert stored is not None
            vm.run = Driver(stored, vm.run.clock)  # on its own VM first (FAILOVER)
    where = f"look {s.report.looks}: controller job {vm.job_id} (key {vm.key!r})"
    if fake.refused[refused:]:
        s.report.violations.append(f"{where} called with an expired token: {fake.refused}")
    if before is None or before.controller_key == vm.key:
        return
    made = [name for name, _a, _k in fake.calls[calls:] if name in _STEERS]
    after = control.load_uri(uri)
    wrote = after is None or after.model_dump_json() != before.model_dump_json()
    if made or wrote:
        s.report.violations.append(
            f"{where} steered ({made or 'wrote the state'}) while key "
            f"{before.controller_key!r} holds the run: two controllers"
        )


def _vms_up(fake: FakeSky) -> None:
    """The cloud gives the training job its VMs (a launch its controller follows no more
    is billed as that controller last saw it: running, here)."""
    for job in fake.live_jobs("llm"):
        for task in fake.job(job).tasks:  # (a job group's failed node stays failed)
            if task.status in _WAITING:
                fake.set_status(job, S.RUNNING, task=task.name)


def _successor(st: control.ControlState) -> int | None:
    """The job of the successor the holder launched and has not given up on."""
    nxt = st.successor
    if nxt is None or nxt.key == st.controller_key or nxt.failed:
        return None
    return nxt.job_id


def _launched(s: Soak, holder: VM) -> int | None:
    """The holder's looks until it launched its successor (a failed launch is tried again
    `RETRY_S` later); its job, or None (the run ended, or no successor in 12 looks)."""
    st = holder.run.state
    for _ in range(12):
        if st.final or holder.run.ctl.succeeded:
            return None
        if _successor(st) is not None:
            return _successor(st)
        nxt, gap = st.successor, GAP
        if nxt is not None and nxt.failed and nxt.key != st.controller_key:
            gap = max(GAP, nxt.at + RETRY_S - holder.run.clock.now)
        _look_as(s, holder, gap)
    return _successor(st)


def _handoff(s: Soak, holder: VM) -> VM:
    """See the module docstring: the successor that holds the run at the end (or the holder,
    where the hand-off did not come about)."""
    fake, rng = s.fake, s.rng
    _arm(s, holder, TOKEN_MARGIN_S + HANDOFF_MARGIN_S - rng.uniform(0, 1800))
    job = _launched(s, holder)
    if job is None:
        return holder
    for _ in range(rng.randint(0, 3)):  # SkyPilot looks for the successor's CPU VM
        _look_as(s, holder, GAP)
    training = [j for j in fake.live_jobs("llm") if fake.job(j).tasks[0].status is S.RUNNING]
    if training and not holder.run.state.final:  # a relaunch in flight at hand-off time
        fake.set_status(training[0], S.FAILED_CONTROLLER)
        fake.lose("jobs.launch")
        _look_as(s, holder, 0.0)
    fake.set_status(job, S.RUNNING)
    journaled = holder.run.state.successor
    assert journaled is not None
    nxt = _vm(s, f"job{job}", journaled.key, job)
    _look_as(s, nxt, 30.0)  # it starts: the run is not its own yet
    for _ in range(6):
        if holder.run.state.final or holder.run.ctl.succeeded:
            break
        _look_as(s, holder, 30.0)
        _look_as(s, nxt, 30.0)
    if not holder.run.ctl.succeeded:
        return holder
    s.homes.append((holder.home, holder.run.clock.now))
    _look_as(s, nxt, 60.0)  # the run is its own: it adopts what the holder launched
    _late_restart(s, holder)
    return nxt


def _late_restart(s: Soak, old: VM) -> None:
    """SkyPilot restarts the old controller after its hand-off (a crash before its exit) on a
    fresh VM, with its job's key and token: it must touch nothing; then it exits 0."""
    again = _vm(s, f"job{old.job_id}-again", old.key, old.job_id)
    again.token = old.token
    with _on(again):
        again.run.ctl.token_ends = token_ends(again.run.ctl.backend)
    for _ in range(2):
        if again.run.ctl.succeeded:
            break
        _look_as(s, again, 30.0)
    if old.job_id is not None and s.fake.job(old.job_id).live:
        s.fake.set_status(old.job_id, S.SUCCEEDED)
    s.homes.append((again.home, again.run.clock.now))


def _token_stop(s: Soak, holder: VM) -> VM:
    """See the module docstring: the controller `up --resume` started."""
    ends = _arm(s, holder, TOKEN_MARGIN_S + s.rng.uniform(1800, 3 * 3600))
    st = holder.run.state
    while not st.final and holder.run.clock.now < ends + GAP:  # its successor stays PENDING
        _look_as(s, holder, s.rng.choice([GAP, 2 * GAP]))
    if not st.final or "token expired" in (st.detail or ""):
        s.report.violations.append(
            f"fault {s.n}: controller job {holder.job_id} still held the run at its token's "
            f"expiry ({st.phase}: {st.detail})"
        )
    return _resume(s, holder)


def _blind(s: Soak, holder: VM) -> VM:
    """See the module docstring: the controller `up --resume` started. It stalls while a
    job it steers trains, where the run gets one (`soakfaults._trains`): the stint no look
    of it sees is the laptop's `down` to close (`billing.close_downed`)."""
    from tests.soakfaults import _trains

    fake = s.fake
    _trains(s)
    if holder.run.state.final:
        return holder
    ends = _arm(s, holder, TOKEN_MARGIN_S + s.rng.uniform(600, 3600))
    for _ in range(3):  # its last looks before its stop point, its training job running
        _vms_up(fake)
        _look_as(s, holder, 60.0)
        if holder.run.state.final:
            return holder
        live = [fake.job(j).tasks[0].status for j in fake.live_jobs("llm")]
        if all(status is S.RUNNING for status in live):
            break
    holder.run.clock.now = ends + s.rng.uniform(1.0, 1800.0)  # no look in between
    calls, refused = len(fake.calls), len(fake.refused)
    with _on(holder):
        holder.run.ctl.look()
    s.report.looks += 1
    made = [name for name, _a, _k in fake.calls[calls:]] + fake.refused[refused:]
    if made:
        s.report.violations.append(
            f"look {s.report.looks}: controller job {holder.job_id} called SkyPilot past its "
            f"token's expiry: {made[:4]}"
        )
    return _resume(s, holder, down=True)


def _key_of(s: Soak, job: int) -> str:
    """The hand-off key in a controller job's envs ("": none)."""
    docs = [d for d in yaml.safe_load_all(s.fake.job(job).yaml or "") if d and "envs" in d]
    return str(docs[0]["envs"].get(HANDOFF_ENV, "")) if docs else ""


def _strays(s: Soak, old: VM) -> None:
    """A successor the stopped run no longer waits for gets its VM at last: it must end
    (exit 0), touching nothing."""
    fake = s.fake
    for job in fake.live_jobs(f"{old.run.state.name}-control"):
        key = _key_of(s, job)
        if job == old.job_id or not key:
            continue
        fake.set_status(job, S.RUNNING)
        stray = _vm(s, f"job{job}", key, job)
        _look_as(s, stray, 30.0)
        if not stray.run.ctl.succeeded:
            s.report.violations.append(f"fault {s.n}: successor job {job} given up on runs on")
        fake.set_status(job, S.SUCCEEDED)
        s.homes.append((stray.home, stray.run.clock.now))


def _resume(s: Soak, old: VM, *, down: bool = False) -> VM:
    """The old controller exited 0; from the laptop, `mncloud down` first (`down`: what may
    still run), then `up --deadline --resume`: the new controller job on its VM."""
    from mncloud.control.down import stop_cloud
    from mncloud.control.start import start

    fake, uri = s.fake, old.run.state.config.state_uri or ""
    if old.job_id is not None and fake.job(old.job_id).live:
        fake.set_status(old.job_id, S.SUCCEEDED)
    s.homes.append((old.home, old.run.clock.now))
    fake._failing.clear()  # faults drawn for the old controller's calls, never made, are gone
    fake._losing.clear()
    stored = control.load_uri(uri)
    if down and stored is not None:
        _from_laptop(s)
        _again(lambda: stop_cloud(stored, 0.0), s, old)
    _strays(s, old)
    started = _again(lambda: start(_from_laptop(s, existing="resume")), s, old)
    if started is None or started.controller_job_id is None:
        return old  # never resumed: the soak ends with the run
    fake.set_status(started.controller_job_id, S.RUNNING)
    new = _vm(s, f"job{started.controller_job_id}", "", started.controller_job_id)
    with _on(new), contextlib.suppress(MncloudError):  # LaunchUnknown: SkyPilot restarts it
        new.run.ctl._recover()
    return new


def _again(act: Callable[[], T], s: Soak, old: VM) -> T | None:
    """`act` from the laptop, run again while it says it could not (the API server away, a
    cancel not yet done), as a user would; back on the VM after."""
    try:
        for _attempt in range(6):
            with contextlib.suppress(MncloudError):
                return act()
        return None
    finally:
        _back_on_vm(s, old.home)
