"""The cloud fault soak: a seeded random schedule of SkyPilot faults over `tests/fakesky/`
drives a cloud deadline controller (the real one, on a fake clock), and after every look
checks the invariants of issue #43.

Faults: API errors at the queue, a lost launch answer, a slow cancel (past `WAIT_S`), a spot
preemption and SkyPilot's own recovery, SkyPilot failing the job, no spot capacity, the
controller restarted on a fresh VM (an empty home, the state from the bucket); and
(`LATER_FAULTS`) `down` at a random moment, a second `up --deadline` of the name from another
laptop, one node of a job group failing; (`soakfaults.NEW_FAULTS`, issue #52) requests held
in flight across a controller restart and an interrupted `up`, a second API user, `jobs.cancel`
and `api_status` failing, a 401, the controller's job dying while its training job lives, a
launch the server failed beside a lost answer; (`soaklease.LEASE_FAULTS`, #58) the controller
killed mid-launch, then `up --resume`; (`soaktoken.TOKEN_FAULTS`, #58) the controller's token
near its expiry: a hand-off to a successor controller job, a stop before the expiry, a
controller stalled past it. At the end, `down` from the laptop's API user,
then whatever request is still in flight finishes. Invariants: never two live
training jobs of the run; after `down` nothing live (the controller's own job included); the
run's secret and the API server's password in no state, record or task YAML, and its `--env`
value not in the controller's state in the bucket; the ledger's billed seconds (every home's
records of the run, each read up to when its controller VM went) equal the seconds the fake's
VMs ran the training jobs, within one tick (`soakledger.money_kept`); and
`soakfaults.final_checks`. `soak()` returns what it did, for docs/benchmarks.md
(`bench/cloud_soak.sh` runs the long version).
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
from tests.soakfaults import NEW_FAULTS, Soak, apply, final_checks
from tests.soaklease import LEASE_FAULTS, lease_fault
from tests.soakledger import money_kept
from tests.soaktoken import TOKEN_FAULTS, token_fault
from tests.test_control import GAP
from tests.test_control_cloud import Driver, _fresh_vm

SECRET = "soak-s3cr3t-value-7f3a"
CONTROLLER_VM = User("controller-vm", "c0417000")
"""The controller VM's API user (its own service-account identity, not the laptop's)."""
FAULTS = ("api_error", "lost_answer", "slow_cancel", "preempt", "recovered", "job_failed",
          "no_capacity", "restart")  # fmt: skip


_TO = {"preempt": S.RECOVERING, "recovered": S.RUNNING, "job_failed": S.FAILED_CONTROLLER,
       "no_capacity": S.FAILED_NO_RESOURCE}  # fmt: skip
_LIVE = (S.PENDING, S.STARTING, S.RUNNING, S.RECOVERING)
"""A job SkyPilot may fail or preempt (not one being cancelled: CANCELLING only ends)."""
_FROM = {"preempt": (S.RUNNING,), "recovered": (S.PENDING, S.STARTING, S.RECOVERING)}


@dataclass
class Report:
    seed: int
    faults: dict[str, int] = field(default_factory=dict)
    looks: int = 0
    launches: int = 0
    downs_refused: int = 0
    billed_s: float = 0.0
    """Seconds the ledger bills (all nodes together: a record's $/h is the whole job's)."""
    ran_s: float = 0.0
    """Seconds the fake's VMs ran the training jobs, all nodes together (`_ran_s`)."""
    violations: list[str] = field(default_factory=list)


def _look(run: Driver, fake: FakeSky, report: Report, gap: float) -> None:
    run.ctl.look()
    run.clock.now += gap
    report.looks += 1
    live = fake.live_jobs("llm")
    if len(live) > 1:
        report.violations.append(f"look {report.looks}: two live training jobs {live}")
    training = [j for j in live if any(t.status in _LIVE for t in fake.job(j).tasks)]
    if run.state.final and training:  # ended, and nobody steers what still trains
        report.violations.append(
            f"look {report.looks}: the controller ended the run ({run.state.phase}) while "
            f"job {training} trains on"
        )


def _apply(kind: str, rng: random.Random, fake: FakeSky, run: Driver) -> None:
    live = fake.live_jobs("llm")
    if kind == "api_error":
        fake.fail("jobs.queue_v2", sx.ApiServerConnectionError(fake.server_url), rng.randint(1, 3))
    elif kind == "lost_answer":
        fake.lose("jobs.launch", rng.randint(1, 2))
    elif kind == "slow_cancel":
        fake.cancel_polls = rng.randint(1, 4)
    elif kind in ("preempt", "recovered", "job_failed", "no_capacity") and live:
        now = fake.job(live[0]).tasks[0].status
        if now in _FROM.get(kind, _LIVE):  # SkyPilot's own transitions only
            _set_live(fake, live[0], _TO[kind])


def _set_live(fake: FakeSky, job: int, status: S) -> None:
    """`status` on the job's tasks SkyPilot has not ended (a job group's failed node stays
    failed: a preemption, or the VMs coming back, does not revive it)."""
    for task in fake.job(job).tasks:
        if not task.status.is_terminal():
            fake.set_status(job, status, task=task.name)


def soak(
    fake: FakeSky,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    state: control.ControlState,
    seed: int,
    faults: int,
    menu: tuple[str, ...] | None = None,
) -> Report:
    """`faults` random faults (see the module docstring; `menu`: of those kinds only) on the
    run of `state`, then `down` from the laptop."""
    from mncloud.backends.skypilot import cancel

    monkeypatch.setitem(cancel.cancel_jobs.__kwdefaults__, "wait_s", 0.0)
    monkeypatch.setitem(cancel.cancel_jobs.__kwdefaults__, "sleep", lambda _s: None)
    rng, report = random.Random(seed), Report(seed)
    s = Soak(rng, fake, Driver(state), monkeypatch, tmp_path, report)
    _controller_job(fake, monkeypatch, state)
    fake.as_user(CONTROLLER_VM)  # its VM's own identity; the laptop's is LAPTOP
    for moment in schedule(rng, faults, _kinds(menu), early=FAULTS):
        if _moment(s, moment):
            break  # `down`: the run is over
        for _ in range(rng.randint(1, 3)):
            if s.run.state.final:
                break
            _look(s.run, fake, report, rng.choice([1.0, GAP]))
        for job in fake.live_jobs("llm"):  # the cloud gives the job its VMs again
            waits = fake.job(job).tasks[0].status in _FROM["recovered"]
            if rng.random() < 0.5 and waits:
                _set_live(fake, job, S.RUNNING)
        if s.run.state.final:
            break
    _down_at_the_end(s)
    report.launches = len(fake.called("jobs.launch"))
    _secrets_kept(fake, tmp_path, report)
    _credentials_kept(fake, tmp_path, report)
    final_checks(s)
    s.homes.append((os.environ["MNCLOUD_HOME"], s.run.clock.now))
    money_kept(fake, monkeypatch, s.homes, report, bucket=f"file://{tmp_path / 'bucket'}")
    return report


def _moment(s: Soak, kinds: list[str]) -> bool:
    """The faults of one moment, in turn; True when one ended the run (`down`)."""
    fake, report, rng = s.fake, s.report, s.rng
    # a failed node last: a fault after it that ends the whole job would end the rest it leaves
    for kind in sorted(kinds, key=lambda k: k == "node_failed"):
        s.n += 1
        report.faults[kind] = report.faults.get(kind, 0) + 1
        if kind in LATER_FAULTS:
            if _later_fault(kind, rng, fake, s.run, s.monkeypatch, s.tmp_path, report):
                return True
        elif kind in NEW_FAULTS:
            apply(kind, s)
        elif kind in LEASE_FAULTS:
            lease_fault(kind, s)
        elif kind in TOKEN_FAULTS:
            token_fault(kind, s)
        elif kind == "restart":
            s.homes.append((os.environ["MNCLOUD_HOME"], s.run.clock.now))
            fresh = _fresh_vm(s.monkeypatch, s.tmp_path, f"vm-{report.seed}-{s.n}")
            s.run = Driver(fresh, s.run.clock)
            with contextlib.suppress(MncloudError):  # LaunchUnknown: SkyPilot restarts it
                s.run.ctl._recover()
        else:
            _apply(kind, rng, fake, s.run)
    return False


def _kinds(menu: tuple[str, ...] | None) -> list[str]:
    every = FAULTS + LATER_FAULTS + NEW_FAULTS + LEASE_FAULTS + TOKEN_FAULTS
    kinds = [k for k in every if menu is None or k in menu]
    return kinds or ["recovered"]


def schedule(
    rng: random.Random, faults: int, kinds: list[str], early: tuple[str, ...] = ()
) -> list[list[str]]:
    """`faults` moments of faults: every kind once per round, each round in a seeded random
    order, so that each seed meets every kind once `faults` reaches their number; with fewer
    moments than kinds, some moments bring two faults at once (an API error while a node
    fails). The first fault is one of `early` (there is a run first), `down` (it ends the
    run) comes last, in a moment of its own: a fault beside it would have no look after it."""
    deck: list[str] = []
    while len(deck) < max(faults, len(kinds)):
        deck += rng.sample(kinds, len(kinds))
    deck = deck[: max(faults, len(kinds))]
    alone = faults > 1 and "down" in deck
    if "down" in deck:
        deck = [k for k in deck if k != "down"] + ([] if alone else ["down"])
    first = next((i for i, k in enumerate(deck) if k in early), 0) if early else 0
    deck.insert(0, deck.pop(first))
    moments: list[list[str]] = [[] for _ in range(min(faults - alone, len(deck)))]
    for i, kind in enumerate(deck):
        moments[i * len(moments) // len(deck)].append(kind)
    return [*moments, *([["down"]] if alone else [])]


def _down_at_the_end(s: Soak) -> None:
    """`down` from the laptop's API user, the API back, run again while it says it could not
    finish; then the server finishes whatever request was still in flight, and nothing of
    the run may be live."""
    from mncloud.backends.skypilot import cancel

    fake, report = s.fake, s.report
    fake.reachable()
    fake._failing.clear()  # the API back: failures drawn for calls never made are gone
    fake.as_user(LAPTOP)
    fake.cancel_polls = 1
    s.monkeypatch.setitem(cancel.cancel_jobs.__kwdefaults__, "wait_s", 30.0)
    for _attempt in range(5):  # `down` while API errors last says so; the user runs it again
        try:
            _down(s.run)
            break
        except MncloudError:
            report.downs_refused += 1
    fake.finish_in_flight()
    if fake.live_jobs():
        report.violations.append(f"after down: live {fake.live_jobs()}")


def _down(run: Driver) -> None:
    from mncloud.control.down import stop_cloud

    stop_cloud(run.state, 0.0)


def _secrets_kept(fake: FakeSky, tmp_path: Path, report: Report) -> None:
    """The secret's value in no file under `tmp_path` (homes, bucket, records, states) and in
    no task YAML the server keeps."""
    for path in tmp_path.rglob("*"):
        if path.is_file() and SECRET.encode() in path.read_bytes():
            report.violations.append(f"secret in {path}")
    for job in fake.jobs.values():
        if SECRET in job.yaml:
            report.violations.append(f"secret in job {job.job_id}'s YAML")


# ------------------------------------------------------ #43's later faults and checks

LATER_FAULTS = ("down", "second_up", "node_failed")
PASSWORD = "soak-api-pw-51c9"
ENDPOINT = f"https://alice:{PASSWORD}@sky.example.com:46580"
ENV_VALUE = "soak-env-value-0b2e"


def _controller_job(
    fake: FakeSky, monkeypatch: pytest.MonkeyPatch, st: control.ControlState
) -> None:
    """The controller's own managed job (`llm-control`, its envs naming the state in the
    bucket: `down` and the lease find it there), and an API server behind basic auth."""
    from sky.server import common as server_common

    from mncloud.control.access import controller_access

    monkeypatch.setattr(server_common, "get_server_url", lambda host=None: ENDPOINT)
    access = controller_access(ENDPOINT, [], {}, {"NOTE": ENV_VALUE})
    for name, value in access.secrets.items():  # what the controller VM gets as secrets
        if name != "SKYPILOT_API_SERVER_ENDPOINT":
            monkeypatch.setenv(name, value)
    job = fake.add_job("llm-control", S.RUNNING)
    fake.job(
        job
    ).yaml = f"name: llm-control\nenvs:\n  MNCLOUD_CONTROL_STATE_URI: {st.config.state_uri}\n"
    st.controller_job_id = job


def _later_fault(
    kind: str,
    rng: random.Random,
    fake: FakeSky,
    run: Driver,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    report: Report,
) -> bool:
    """One of `LATER_FAULTS`; True when it ended the run (`down`)."""
    if kind == "down":
        _down_now(run, fake, report)
        return True
    if kind == "second_up":
        _second_up(run, fake, monkeypatch, tmp_path, report)
    else:
        _node_failed(rng, fake, run)
    return False


def _down_now(run: Driver, fake: FakeSky, report: Report) -> None:
    """`down` whatever is going on (API errors, a slow cancel, a launch in flight): run again
    while it says it could not finish, as a user would; then nothing of the run is live."""
    for _attempt in range(5):
        try:
            _down(run)
            break
        except MncloudError:
            report.downs_refused += 1
    else:
        return  # still refused: the soak's final `down` (the API back) must finish it
    if fake.live_jobs():
        report.violations.append(f"look {report.looks}: live after down: {fake.live_jobs()}")


def _second_up(
    run: Driver,
    fake: FakeSky,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    report: Report,
) -> None:
    """`up --deadline --name llm` from another laptop while the controller lives: refused in
    one line naming `mncloud status llm` and `--replace`; nothing launched."""
    import os

    from mncloud.control.start import start

    home, jobs, vm = os.environ["MNCLOUD_HOME"], len(fake.jobs), fake.user
    monkeypatch.setenv("MNCLOUD_HOME", str(tmp_path / f"laptop-{report.looks}"))
    fake.as_user(LAPTOP)
    st = run.state
    again = control.ControlState(name=st.name, config=st.config, spec=st.spec, options=st.options)
    try:
        start(again)
        report.violations.append(f"look {report.looks}: a second up was not refused")
    except SpecError as err:  # (a BackendError: the queue could not be asked, refused too)
        said = str(err)
        if "mncloud status llm" not in said or "--replace" not in said or "\n" in said:
            report.violations.append(f"look {report.looks}: second up refused as {said!r}")
    except MncloudError:
        pass
    finally:
        monkeypatch.setenv("MNCLOUD_HOME", home)
        fake.as_user(vm)
    if len(fake.jobs) != jobs or len(fake.live_jobs("llm-control")) > 1:
        report.violations.append(f"look {report.looks}: a second up launched something")


def until_live(fake: FakeSky, run: Driver, looks: int = 12) -> None:
    """Looks a minute apart until a training job is live or the run ended, `looks` at most: a
    launch waiting for its next look, or for a backoff's end (after a 401, no capacity, a
    crash in launch), is made first."""
    for _ in range(looks):
        if fake.live_jobs("llm") or run.state.final:
            return
        run.ctl.look()
        run.clock.now += 60.0


def until_steered(fake: FakeSky, run: Driver) -> None:
    """Looks a tick apart until a training job is live and the controller steers it (nothing
    of it journaled half done: `closing`, a take-down whose cancel failed; `launching`, a
    launch not yet answered; finishing either cancels the whole job anyway), or the run
    ended; a few ticks past `probe_after_s` at most (a controller with no capacity anywhere
    waits that long before it tries spot again)."""
    for _ in range(int(run.state.config.probe_after_s // GAP) + 3):
        st = run.state
        if st.final or (fake.live_jobs("llm") and st.closing is None and st.launching is None):
            return
        run.ctl.look()
        run.clock.now += GAP


def _node_failed(rng: random.Random, fake: FakeSky, run: Driver) -> None:
    """One node of the live launch fails in the user's program past its restarts (a job
    group's others train on): a running node (a job still waiting for VMs gets them first)
    of a launch the controller steers, not one it is taking down (its own cancel would hide
    a missing group cancel); none yet: it waits for one (`until_steered`)."""
    until_steered(fake, run)
    live = fake.live_jobs("llm")
    if not live or run.state.final:
        return
    tasks = fake.job(live[0]).tasks
    if not any(t.status is S.RUNNING for t in tasks):
        if tasks[0].status not in _FROM["recovered"]:
            return  # (CANCELLING: it only ends)
        _set_live(fake, live[0], S.RUNNING)  # the cloud gives it its VMs; the program starts
    nodes = [t for t in tasks if t.primary and t.status is S.RUNNING] or tasks
    node = rng.choice(nodes)
    fake.set_status(live[0], S.FAILED, task=node.name, reason=f"{node.name}'s program exited 1")


def _credentials_kept(fake: FakeSky, tmp_path: Path, report: Report) -> None:
    """The API server's password in no file and no task YAML; the `--env` value not in the
    controller's state in the bucket (it names it only; run records keep `--env` values by
    design, for `rerun`), and in every training task."""
    for path in tmp_path.rglob("*"):
        if path.is_file() and PASSWORD.encode() in path.read_bytes():
            report.violations.append(f"API password in {path}")
    for path in (tmp_path / "bucket").rglob("control/state.json"):
        if ENV_VALUE.encode() in path.read_bytes():
            report.violations.append(f"--env value in the bucket's {path}")
    for job in fake.jobs.values():
        if PASSWORD in job.yaml:
            report.violations.append(f"API password in job {job.job_id}'s YAML")
        if job.name == "llm" and ENV_VALUE not in job.yaml:
            report.violations.append(f"job {job.job_id} launched without its --env value")


def soak_state(script: Path, tmp_path: Path, **flags: Any) -> control.ControlState:
    """A cloud deadline run with a secret, a long deadline and (unless `flags` say) many
    restarts allowed."""
    from mncloud.request import build_spec
    from mncloud.spec.launch import LaunchOptions

    bucket = f"file://{tmp_path / 'bucket'}"
    flags.setdefault("max_restarts", 50)
    spec = build_spec(script, gpus="H100:8", nodes=4, name="llm", bucket=bucket,
                      secret=["SOAK_TOKEN"], env=[f"NOTE={ENV_VALUE}"], **flags)  # fmt: skip
    state = control.deadline_state(
        spec, LaunchOptions(hours=2, recovery_minutes=10), deadline_s=12 * 3600,
        hours_given=True, spot_price=10.0, on_demand_price=30.0, policy="uniform-progress",
    )  # fmt: skip
    control.save_state(state)
    return state
