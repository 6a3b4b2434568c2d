"""The cloud fault soak of a plain `mncloud up` (no deadline controller): the backend alone
launches, looks (`status`), resumes a failed run (`up --resume`) and takes it down, on
`tests/fakesky/` with `time.time` on a fake clock. It guards what only the plain path does
(issue #52): a lost launch answer resolved from the server (a job and a job group alike), a
failed group's rest cancelled and billed to its end.

Faults: a lost launch answer, a launch the server failed, API errors at the queue, a spot
preemption and SkyPilot's recovery, one node (or the job) failing past its restarts. After
each look: never two live training jobs; a run `status` calls FAILED has nothing left
training (CANCELLING, its VMs going, is fine), and its failure kind is the world's: the
user's (`Failure.USER`) exactly when a node of its job failed in the user's program, else
SkyPilot's (a launch the server failed, or no job made, is `INFRA`), never none. A failed run
is resumed; at the end `down`, then nothing live, and the record bills what the VMs ran,
within one look.
"""

from __future__ import annotations

import contextlib
import random
import time
from pathlib import Path

import pytest
from sky import exceptions as sx
from sky.jobs import ManagedJobStatus as S

from mncloud.backends.base import Failure, RunState, RunStatus
from mncloud.errors import MncloudError
from tests.fakesky import FakeSky

PLAIN_FAULTS = ("lost_answer", "server_failed", "api_error", "preempt", "recovered",
                "node_failed")  # fmt: skip
GAP = 300.0
_TRAINING = (S.PENDING, S.STARTING, S.RUNNING, S.RECOVERING)


def plain_soak(
    fake: FakeSky,
    monkeypatch: pytest.MonkeyPatch,
    folder: Path,
    script: Path,
    seed: int,
    faults: int,
    *,
    group: bool,
    menu: tuple[str, ...] | None = None,
) -> list[str]:
    """`faults` random faults on a plain run (a job group with `group`); its violations."""
    from mncloud.backends.skypilot import SkyPilotBackend, cancel
    from mncloud.launch import Existing, launch
    from mncloud.request import build_spec
    from tests.cloudsoak import schedule

    monkeypatch.setitem(cancel.cancel_jobs.__kwdefaults__, "wait_s", 0.0)  # `down` again
    monkeypatch.setitem(cancel.cancel_jobs.__kwdefaults__, "sleep", lambda _s: None)
    now = [time.time()]
    monkeypatch.setattr(time, "time", lambda: now[0])
    fake.clock = lambda: now[0]
    if group:
        from mncloud.render import jobgroup

        script.write_text("from mncloud.train import Replicas\nreplicas = Replicas({})\n")
        monkeypatch.setattr(jobgroup, "require_bucket", lambda _spec: None)
    spec = build_spec(script, gpus="H100:8", nodes=4, spot=True, name="llm", max_restarts=50,
                      bucket=f"file://{folder / 'bucket'}",
                      **({"recovery": "node"} if group else {}))  # fmt: skip
    rng, violations, backend = random.Random(seed), [], SkyPilotBackend()
    kinds = [k for k in PLAIN_FAULTS if menu is None or k in menu] or ["recovered"]
    existing, final = Existing.REFUSE, True
    users: set[int] = set()
    """The jobs a node of which failed in the user's program (`node_failed`)."""
    for n, moment in enumerate(schedule(rng, faults, kinds)):  # every kind, each seed
        for kind in moment:
            users |= _apply(kind, rng, fake)
        if final:
            with contextlib.suppress(MncloudError):  # a lost answer, or a failed launch
                launch(spec, existing=existing, approve=lambda _plan: True)
            existing, final = Existing.RESUME, False
        for _ in range(rng.randint(1, 3)):
            now[0] += rng.choice([1.0, GAP])
            try:
                status = backend.status("llm")
            except MncloudError:
                continue
            violations += _check(fake, status, n) + _kind(status, users, n)
            final = status.state.is_final
    fake.reachable()
    fake._failing.clear()  # the API back
    for _attempt in range(5):
        try:
            backend.down("llm")
            break
        except MncloudError:
            now[0] += 60
    fake.finish_in_flight()
    if fake.live_jobs():
        violations.append(f"after down: live {fake.live_jobs()}")
    return violations + _money(fake, now[0])


def _apply(kind: str, rng: random.Random, fake: FakeSky) -> set[int]:
    """Fault `kind` in the fake's world; the job a node of which it failed (the user's)."""
    live = fake.live_jobs("llm")
    if kind == "lost_answer":
        fake.lose("jobs.launch")
    elif kind == "server_failed":
        fake.fail("jobs.launch", ConnectionRefusedError("the cloud's API is unreachable"))
    elif kind == "api_error":
        fake.fail("jobs.queue_v2", sx.ApiServerConnectionError(fake.server_url), rng.randint(1, 2))
    elif not live:
        return set()
    elif kind == "preempt":
        if fake.job(live[0]).tasks[-1].status is S.RUNNING:
            fake.set_status(live[0], S.RECOVERING)
    elif kind == "recovered":
        for one in fake.job(live[0]).tasks:
            if one.status in (S.PENDING, S.STARTING, S.RECOVERING):
                one.script.append(S.RUNNING)
    else:  # node_failed: one node (a plain job: the job) past its restarts
        tasks = fake.job(live[0]).tasks
        node = rng.choice([t for t in tasks if t.primary] or tasks)
        if node.status in _TRAINING:
            fake.set_status(live[0], S.FAILED, task=node.name, reason="the program exited 1")
            return {live[0]}
    return set()


def _check(fake: FakeSky, status: RunStatus, n: int) -> list[str]:
    live = fake.live_jobs("llm")
    found = [f"fault {n}: two live training jobs {live}"] if len(live) > 1 else []
    training = [j for j in live if any(t.status in _TRAINING for t in fake.job(j).tasks)]
    if status.state is RunState.FAILED and training:
        found.append(f"fault {n}: status FAILED while job {training} trains on")
    return found


def _kind(status: RunStatus, users: set[int], n: int) -> list[str]:
    """A FAILED run's failure kind against the world: the user's exactly when a node of its
    job failed in the user's program (`users`), else SkyPilot's; never none."""
    from mncloud.backends.skypilot.meta import load_meta

    if status.state is not RunState.FAILED:
        return []
    meta = load_meta("llm")
    job = meta.job_id if meta is not None else None
    theirs = job in users
    if status.failure is None or (status.failure is Failure.USER) != theirs:
        truth = "the user's program" if theirs else f"SkyPilot's ({status.detail})"
        return [f"fault {n}: job {job} FAILED as {status.failure}, it was {truth}"]
    return []


def _money(fake: FakeSky, now: float) -> list[str]:
    """The records bill what the VMs ran (a job group: the nodes' mean), within one look."""
    from mncloud.records.ledger import cost_summary
    from mncloud.records.store import list_records

    billed = sum(
        s.end - s.start for r in list_records("llm") for s in cost_summary(r, now).segments
    )
    ran = 0.0
    for job in fake.jobs.values():
        seconds = fake.running_seconds(job.job_id)
        ran += seconds[0] if len(seconds) == 1 else sum(seconds[1:]) / len(seconds[1:])
    if abs(billed - ran) > GAP:
        return [f"billed {billed:.0f} s, the VMs ran {ran:.0f} s"]
    return []
