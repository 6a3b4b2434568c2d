"""Each fix the cloud fault soak guards, taken back out in-process (issue #52's mutation check).

`MUTATIONS[name].undo(monkeypatch)` puts the code back as it was before the fix (the old
function, or the old value, patched in for one test); `soak_catches` runs the soak
(`tests/cloudsoak.py`) on seeds until one reports a violation. The short form
(`tests/test_soak_mutations.py`) draws from the faults about the fix (`menu`) and stops at the
first seed that catches it; the long form (`bench/soak_mutations.sh`) runs every seed of the
whole menu and reports, per mutation, the seeds that caught it (docs/benchmarks.md).

    request name      `find.launch_request_name`: the bare SDK name `jobs.launch`, never what
                      the server lists (`sky.jobs.launch`): a launch in flight not waited for
    all_users         every queue read of the caller's jobs only (`all_users=False`)
    unsure retry      the first error in a look fails the run (`UNSURE_LOOKS = 0`)
    group cancel      a failed launch's live rest (a job group's other nodes) not cancelled
                      before the relaunch (`outcomes._cancel_the_rest`)
    lease             any number of controllers (`lease.take` does nothing)
    lost answer       a launch whose answer was lost taken for a failed one
    1 failed rest     a plain run's failed group's rest left training (`cancel_failed_rest`)
    2 in flight       an `up` cut short while its controller launch was in flight not seen
    3 group lost      a job group's lost answer taken for a failed launch (the second path)
    4 dead controller a new controller launched beside a dead one's live training job
    5 token life      a deadline past the controller's 3-day token accepted
    6 server failed   a launch the server failed (connection-type error) taken for a lost
                      answer, resolved as "made no job", counted as the user's error
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest


@dataclass(frozen=True)
class Mutation:
    undo: Callable[[pytest.MonkeyPatch], None]
    menu: tuple[str, ...]
    """The soak's faults about the fix (the short form draws from these only)."""
    group: bool = False
    """Soaked on a job group (`--recovery node`) rather than a plain managed job."""
    plain: bool = False
    """Soaked as a plain `up` (no deadline controller: `tests/plainsoak.py`)."""


def _request_name(mp: pytest.MonkeyPatch) -> None:
    from mncloud.backends.skypilot import find

    mp.setattr(find, "launch_request_name", lambda: "jobs.launch")


def _all_users(mp: pytest.MonkeyPatch) -> None:
    import sky

    asked = sky.jobs.queue_v2  # the fake's, installed before

    def mine_only(*args: Any, **kwargs: Any) -> Any:
        return asked(*args, **{**kwargs, "all_users": False})

    mp.setattr(sky.jobs, "queue_v2", mine_only)


def _unsure_retry(mp: pytest.MonkeyPatch) -> None:
    from mncloud.control import unsure

    mp.setattr(unsure, "UNSURE_LOOKS", 0)


def _group_cancel(mp: pytest.MonkeyPatch) -> None:
    from mncloud.control import outcomes

    mp.setattr(outcomes, "_cancel_the_rest", lambda _ctl: None)


def _lease(mp: pytest.MonkeyPatch) -> None:
    from mncloud.control import lease

    mp.setattr(lease, "take", lambda _state: None)


def _lost_answer(mp: pytest.MonkeyPatch) -> None:
    from mncloud.backends.skypilot import backend

    mp.setattr(backend, "lost_answer_errors", lambda: ())  # caught nowhere: launch failed


def _failed_rest(mp: pytest.MonkeyPatch) -> None:
    from mncloud.backends.skypilot import backend

    mp.setattr(backend, "cancel_failed_rest", lambda _meta, status: status)


def _in_flight(mp: pytest.MonkeyPatch) -> None:
    from mncloud.backends.skypilot import find

    mp.setattr(find, "launches_in_flight", lambda _name, wait=False: [])


def _group_lost(mp: pytest.MonkeyPatch) -> None:
    """The job group's own launch as it was: any error of the wait is a failed launch."""
    import sky as sky_module

    from mncloud.backends.skypilot import backend

    fixed = backend.SkyPilotBackend._launch_managed_job

    def old(self: Any, entry: Any, name: str, meta: Any) -> int:
        if not isinstance(entry, sky_module.Dag):
            return fixed(self, entry, name, meta)
        with backend.sky_errors(f"launch job group {name}"):
            request_id = sky_module.jobs.launch(entry, name=name)
            meta.request_id = str(request_id)
            backend.save_meta(meta)
            job_ids, _handle = sky_module.stream_and_get(request_id, output_stream=self.progress)
        return int(job_ids[0])

    mp.setattr(backend.SkyPilotBackend, "_launch_managed_job", old)


def _dead_controller(mp: pytest.MonkeyPatch) -> None:
    from mncloud.control import lease

    mp.setattr(lease, "_left_unsteered", lambda _host, _state: None)


def _token_life(mp: pytest.MonkeyPatch) -> None:
    import importlib

    start = importlib.import_module("mncloud.control.start")

    mp.setattr(start, "check_token_life", lambda *_args: None)


def _server_failed(mp: pytest.MonkeyPatch) -> None:
    """No `api_status` look at a failed request; a launch resolved to no job returns None (the
    run PENDING, then "launch failed" with no failure kind: the user's error)."""
    import sky as sky_module

    from mncloud.backends.skypilot import backend, lost

    mp.setattr(lost, "server_failed", lambda _request_id: False)

    def old(self: Any, entry: Any, name: str, meta: Any) -> int | None:
        with backend.sky_errors(f"launch managed job {name}"):
            request_id = sky_module.jobs.launch(entry, name=name)
            meta.request_id = str(request_id)
            backend.save_meta(meta)
        try:
            with backend.sky_errors(name, keep=backend.lost_answer_errors()):
                job_ids, _ = sky_module.stream_and_get(request_id, output_stream=self.progress)
        except backend.lost_answer_errors():
            return backend.resolve_lost(name, str(request_id), meta.run_id)
        return int(job_ids[0]) if job_ids else None

    fixed_status = backend.SkyPilotBackend.status

    def status(self: Any, run_name: str) -> Any:
        answer = fixed_status(self, run_name)
        if answer.detail.startswith("launch failed"):
            answer.failure = None
        return answer

    mp.setattr(backend.SkyPilotBackend, "_launch_managed_job", old)
    mp.setattr(backend.SkyPilotBackend, "status", status)


_BASE = ("recovered", "preempt")
MUTATIONS: dict[str, Mutation] = {
    "request name": Mutation(_request_name, ("crash_in_launch", *_BASE)),
    "all_users": Mutation(_all_users, ("second_user", *_BASE)),
    "unsure retry": Mutation(_unsure_retry, ("api_error", "unauthorized", "cancel_error")),
    "group cancel": Mutation(_group_cancel, ("node_failed", *_BASE), group=True),
    "lease": Mutation(_lease, ("second_up", *_BASE)),
    "lost answer": Mutation(_lost_answer, ("lost_answer", *_BASE), plain=True),
    "1 failed rest": Mutation(_failed_rest, ("node_failed", *_BASE), group=True, plain=True),
    "2 in flight": Mutation(_in_flight, ("interrupted_up", *_BASE)),
    "3 group lost": Mutation(_group_lost, ("lost_answer", *_BASE), group=True, plain=True),
    "4 dead controller": Mutation(_dead_controller, ("controller_died", *_BASE)),
    "5 token life": Mutation(_token_life, ("long_up", *_BASE)),
    "6 server failed": Mutation(_server_failed, ("server_failed", *_BASE)),
}


def soak_once(
    fake: Any,
    mutation: Mutation | None,
    script: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    seed: int,
    faults: int,
    *,
    menu: tuple[str, ...] | None = None,
) -> list[str]:
    """One seed of the soak on the installed `fake` (the `fake_sky` fixture's, emptied: a
    second `install` would not replace the first), a fresh home, `mutation` taken out: its
    violations."""
    from tests.cloudsoak import SECRET, soak, soak_state
    from tests.fakesky import FakeSky, server

    folder = tmp_path / f"seed-{seed}"
    folder.mkdir()
    with monkeypatch.context() as mp:
        mp.setenv("MNCLOUD_HOME", str(folder / "home"))
        mp.setenv("SOAK_TOKEN", SECRET)
        fake.__dict__.clear()
        fake.__dict__.update(FakeSky().__dict__)
        mp.setattr(server, "INSTALLED", fake)
        if mutation is not None:
            mutation.undo(mp)
        group = mutation is not None and mutation.group
        if mutation is not None and mutation.plain:
            from tests.plainsoak import plain_soak

            return plain_soak(fake, mp, folder, script, seed, faults, group=group, menu=menu)
        if group:
            from mncloud.render import jobgroup

            script.write_text("from mncloud.train import Replicas\nreplicas = Replicas({})\n")
            mp.setattr(jobgroup, "require_bucket", lambda _spec: None)
        state = soak_state(script, folder, **({"recovery": "node"} if group else {}))
        return soak(fake, mp, folder, state, seed, faults, menu).violations
