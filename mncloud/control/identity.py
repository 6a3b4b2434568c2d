"""Who the live launch is, kept in the controller's state so a controller restarted anywhere
finds it and never launches it again.

A cloud controller is a SkyPilot managed job; restarted, it may run on a fresh VM with its
state from the bucket and an empty MNCLOUD_HOME. So the launch's identity is part of that state:

    before   the run id its record will have (`Launching.run_id`, journaled with the decision)
    after    `ControlState.live`: run id, SkyPilot job id(s), request id and the backend's own
             record of it (`skypilot.json`); every job id also joins `ControlState.job_ids`

`restore` writes back on a fresh machine what the backend and the ledger read there: the
launch's `skypilot.json`, `backend.json`, the run records from their bucket copies; a RESUME
launch then also sees the live job and refuses to launch over it (`launch.settle_existing`).
`find` looks for a launch journaled but not recorded, by its run id in SkyPilot's queue
(the backend's `ControllerHost`), never by the name alone. Example:

    tick 9   journal: launching on-demand, run id dl-…-9f00aa; `sky.jobs.launch` → job 14;
             state: live = job 14; the VM is lost
    restart  a fresh VM, the state from the bucket: `restore` writes job 14's skypilot.json
             and the records back; the controller watches job 14 and decides tick 10
    (or)     lost before `live` was written: `find` waits for the launch request, finds job 14
             by run id dl-…-9f00aa in its YAML, re-creates its skypilot.json: adopted
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from mncloud.control.state import LiveLaunch
from mncloud.deadline.policy import Mode

if TYPE_CHECKING:
    from mncloud.backends.base import Adopted, ControllerHost
    from mncloud.control.state import ControlState, Launching
    from mncloud.records.model import RunRecord

log = logging.getLogger(__name__)


def _host(st: ControlState) -> ControllerHost | None:
    """The run's controller host; None when its controller runs here (a local run)."""
    from mncloud.backends.registry import get_backend

    backend = get_backend(st.config.backend)
    return None if backend.runs_here else backend.controller_host()


def remember(st: ControlState, run_id: str | None, mode: Mode) -> None:
    """A launch was made (or adopted): its identity into the state (the caller saves it)."""
    if not run_id:
        return
    live = LiveLaunch(run_id=run_id, mode=mode)
    host = _host(st)
    if host is not None:
        meta = host.launch_meta(st.name)
        if meta is not None:
            live.meta = meta
            live.job_ids = [meta["job_id"]] if meta.get("job_id") is not None else []
            live.request_id = meta.get("request_id")
    st.live = live
    st.job_ids = [*st.job_ids, *(j for j in live.job_ids if j not in st.job_ids)]


def restore(st: ControlState) -> list[str]:
    """Write back on this machine what the state knows of its launches and the machine lacks
    (a cloud controller on a fresh VM); what was written, in words."""
    host = _host(st)
    if host is None:
        return []
    from mncloud.backends.registry import known_runs, record_backend
    from mncloud.records.store import list_records

    done = []
    if st.live is not None and st.live.meta:
        meta = host.launch_meta(st.name)
        if meta is None or meta.get("job_id") not in st.live.job_ids:
            host.save_launch_meta(st.live.meta)
            done.append(f"skypilot.json of job(s) {st.live.job_ids}")
    if (st.run_ids or st.live is not None) and st.name not in known_runs():
        record_backend(st.name, st.config.backend)
        done.append("backend.json")
    have = {r.run_id for r in list_records(st.name)}
    live = [st.live.run_id] if st.live is not None else []
    wanted = [*st.earlier_run_ids, *st.run_ids, *live]  # (earlier ones: `billing.close_earlier`)
    missing = [run_id for run_id in dict.fromkeys(wanted) if run_id not in have]
    fetched = [run_id for run_id in missing if fetch_record_of(st, run_id) is not None]
    if fetched:
        done.append(f"run record(s) {', '.join(fetched)}")
    return done


def find(st: ControlState, pending: Launching) -> tuple[str, RunRecord | None] | None:
    """The launch `pending` made before the controller died, found in SkyPilot's queue by its
    run id, with its `skypilot.json` written back: (run id, its record), or None (not made)."""
    from mncloud.backends.registry import record_backend
    from mncloud.constants import RUN_ID_ENV

    host = _host(st)
    if pending.run_id is None or host is None:
        return None
    host.wait_for_launch_requests(pending.run_id)  # a request in flight may still make one
    jobs = host.jobs_with_env(st.name, RUN_ID_ENV, [pending.run_id])
    if not jobs:
        return None
    if len(jobs) > 1:  # one launch call makes one job: keep the newest, say so
        log.warning("run id %s names jobs %s; adopting the newest", pending.run_id,
                    [j.job_id for j in jobs])  # fmt: skip
    job = jobs[-1]
    record = fetch_record_of(st, pending.run_id)
    host.adopt(job, _adopted(st, pending, record))
    record_backend(st.name, st.config.backend)
    return pending.run_id, record


def _adopted(st: ControlState, pending: Launching, record: RunRecord | None) -> Adopted:
    """What a launch found in the queue is written back from: the state's spec, the plan."""
    from mncloud.backends.base import Adopted
    from mncloud.spec import JobSpec

    spec = JobSpec.model_validate(st.spec)
    choice = ((record.plan if record is not None else None) or {}).get("choice") or {}
    return Adopted(
        name=st.name,
        nodes=spec.nodes,
        spot=pending.mode is Mode.SPOT,
        launched_at=pending.at,
        ckpt_uri=spec.ckpt_uri,
        choice=choice,
    )


def fetch_record_of(st: ControlState, run_id: str) -> RunRecord | None:
    """Run `st`'s launch `run_id`'s record from the bucket (kept here too); None: none there."""
    from mncloud.records.store import fetch_record
    from mncloud.spec import JobSpec

    uri = st.ckpt_uri or JobSpec.model_validate(st.spec).ckpt_uri
    return fetch_record(uri, run_id) if uri else None
