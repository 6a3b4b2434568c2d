"""`SkyPilotBackend`: launch, status, logs and down of a run through SkyPilot's SDK."""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, TextIO

from mncloud.backends.base import (
    Failure,
    LaunchRequest,
    RunState,
    RunStatus,
    first_unreadable,
)
from mncloud.backends.skypilot.cancel import (
    cancel_jobs,
    jobs_named,
    live_job_ids,
    server_to_ask,
)
from mncloud.backends.skypilot.cluster import (
    exec_on_cluster,
    launch_cluster,
    require_live_cluster,
)
from mncloud.backends.skypilot.dryrun import dryrun, dryrun_job_group
from mncloud.backends.skypilot.errors import sky_errors
from mncloud.backends.skypilot.events import record_end, record_launch, record_superseded
from mncloud.backends.skypilot.group import cancel_failed_rest, job_group_status, tail_group_logs
from mncloud.backends.skypilot.logs import tail_logs
from mncloud.backends.skypilot.lost import LaunchAnswerLost, lost_answer_errors
from mncloud.backends.skypilot.lost import resolve as resolve_lost
from mncloud.backends.skypilot.meta import (
    BACKEND_NAME,
    CLUSTER,
    JOB_GROUP,
    MANAGED_JOB,
    RunMeta,
    meta_from_plan,
    require_meta,
    save_meta,
    status_from_meta,
)
from mncloud.backends.skypilot.notice import give_notice, withdraw_notice
from mncloud.backends.skypilot.status import cluster_status, managed_job_status
from mncloud.backends.skypilot.task import build_dag, build_task
from mncloud.errors import BackendError, MncloudError, RunNotFoundError
from mncloud.spec import DEFAULT_IDLE_MINUTES, JobSpec

if TYPE_CHECKING:
    from pathlib import Path

    import sky

    from mncloud.backends.base import ControllerHost, Rehearsal
    from mncloud.records.goodput import StepMark

AUTOSTOP_IDLE_MINUTES = DEFAULT_IDLE_MINUTES
"""Idle minutes before a cluster launched by an older mncloud (`sky.launch`, on-demand) tore
itself down after its job ended; shown in those runs' status (`up --cluster` records its own)."""


class SkyPilotBackend:
    """Runs on clouds through SkyPilot: every run a managed job, spot or on-demand, but for
    `up --cluster` (a plain cluster kept up for `exec`, `cluster.py`)."""

    name = BACKEND_NAME
    records_own_events = False
    """Its launch and end only when asked (`_record_launch`); its own recoveries never."""
    runs_here = False

    def __init__(
        self, progress: TextIO | None = None, idle_minutes: int = AUTOSTOP_IDLE_MINUTES
    ) -> None:
        self.progress = progress if progress is not None else sys.stderr
        """Where SkyPilot's provisioning progress is streamed while `launch` waits."""
        self.idle_minutes = idle_minutes

    def settled(self, spec: JobSpec) -> JobSpec:
        """The spec as given (`up --cluster`'s own settling is `launch.cluster_spec`)."""
        return spec

    def launch(self, request: LaunchRequest) -> RunStatus:
        """Launch the run (or dry-run it); return once SkyPilot accepted the job.

        One path for a plain managed job and a job group (`--recovery node`): they differ in
        the DAG handed to `sky.jobs.launch` only (a task, or the group's tasks), so the meta,
        the lost answer's resolution (`lost.py`) and the record are the same code."""
        spec, config, spot = request.spec, request.task.config, request.task.spot
        entry, names = _what_to_launch(request)
        if request.dryrun:
            if names:
                return dryrun_job_group(entry, spec, request.plan, spot)
            return dryrun(entry, spec, request.plan, spot)
        record_superseded(spec.name)
        meta = meta_from_plan(spec, request.plan, spot, config, names)
        if request.options.cluster and not names:  # `up --cluster`: kept up for `exec`
            status = launch_cluster(entry, meta, request.options.idle_minutes, self.progress)
            _record_launch(request, meta)
            return status
        meta.run_id = request.run_id or meta.run_id  # its run, found again by its id
        try:
            meta.job_id = self._launch_managed_job(entry, spec.name, meta)
        except LaunchAnswerLost:
            meta.last_state = RunState.PENDING  # unknown, not failed: `status` resolves it
            save_meta(meta)
            raise
        except MncloudError as err:
            meta.error = str(err)
            meta.last_state = RunState.FAILED
            save_meta(meta)
            raise
        meta.last_state = RunState.PENDING
        save_meta(meta)
        _record_launch(request, meta)
        if names:
            what = f"job group {meta.job_id}: {len(names) - 1} node tasks and a lighthouse"
        else:
            what = f"managed job {meta.job_id}, {'spot' if spot else 'on-demand'}"
        return status_from_meta(meta, meta.last_state, f"launched ({what})")

    def _launch_managed_job(self, entry: sky.Task | sky.Dag, name: str, meta: RunMeta) -> int:
        """The job id SkyPilot gave; an answer lost on the way is resolved from the server
        (`lost.py`), never taken for a failed launch, nor a launch the server failed for a
        lost answer."""
        import sky

        with sky_errors(f"launch managed job {name}"):
            request_id = sky.jobs.launch(entry, name=name)
            meta.request_id = str(request_id)
            save_meta(meta)
        try:
            with sky_errors(f"launch managed job {name}", keep=lost_answer_errors()):
                job_ids, _handle = sky.stream_and_get(request_id, output_stream=self.progress)
        except lost_answer_errors():
            job_id = resolve_lost(name, str(request_id), meta.run_id)
        else:
            job_id = int(job_ids[0]) if job_ids else None
        if job_id is None:
            raise BackendError(f"launch managed job {name}: SkyPilot made no job")
        return job_id

    def exec(self, request: LaunchRequest) -> RunStatus:
        """`mncloud exec`: the task again on the run's live cluster (`sky.exec`); SpecError
        when the run is not a cluster that is up and idle (`cluster.py`)."""
        meta = require_live_cluster(request.spec.name)
        return exec_on_cluster(build_task(request), meta, self.progress)

    def measure_bandwidth(
        self, run_name: str, minimum: float | None, timeout: float
    ) -> tuple[bool, list[str]]:
        """`doctor --bandwidth`: the test on the run's live cluster (`netcheck.py`)."""
        from mncloud.backends.skypilot.netcheck import measure

        return measure(run_name, minimum, timeout, self.progress)

    def status(self, run_name: str) -> RunStatus:
        """Ask SkyPilot for the run's state; add the newest checkpoint and cost so far."""
        meta = require_meta(run_name)
        lost = meta.job_id is None and meta.request_id is not None and meta.error is None
        if meta.kind != CLUSTER and lost:  # a launch whose answer was lost (`lost.py`)
            meta.job_id = resolve_lost(meta.name, meta.request_id, meta.run_id)
            if meta.job_id is None and meta.error is None:
                meta.error = "SkyPilot's answer to the launch was lost, and it made no job"
            save_meta(meta)
        if meta.error is not None:  # SkyPilot's failure to launch, never the user's code
            failed = status_from_meta(meta, RunState.FAILED, f"launch failed: {meta.error}")
            failed.failure = Failure.INFRA
            return failed
        if meta.kind == JOB_GROUP:
            status = job_group_status(meta)
            if meta.records_events:  # a plain run: nothing else ends a failed group's rest
                status = cancel_failed_rest(meta, status)
        elif meta.kind == MANAGED_JOB:
            status = managed_job_status(meta)
        else:
            status = cluster_status(meta, self.idle_minutes)
        recorded = meta.end_recorded
        record_end(meta, status)
        if status.state != meta.last_state or meta.end_recorded != recorded:
            meta.last_state = status.state
            save_meta(meta)
        return status

    def logs(
        self,
        run_name: str,
        node: int | None = None,
        follow: bool = False,
        *,
        since: float | None = None,
    ) -> Iterator[str]:
        """SkyPilot's logs of the run, each line prefixed `[node N]` (`[sky]` for its own);
        they carry no times, so `since` is refused."""
        if since is not None:
            raise BackendError(f"--since: {self.name} logs carry no times; use --tail N")
        meta = require_meta(run_name)
        if meta.error is not None:
            raise BackendError(f"{run_name} never launched: {meta.error}")
        if meta.kind == JOB_GROUP:
            yield from tail_group_logs(meta, node, follow)
        else:
            yield from tail_logs(meta, node, follow)

    def down(self, run_name: str, *, notice_s: float = 0.0, by: str = "mncloud down") -> RunStatus:
        """Cancel every managed job of the run SkyPilot still runs, by id, and return once
        SkyPilot reports them ended (`cancel.py`); a second `down` cancels nothing and says
        so. With `notice_s`, a running job's nodes first get a stop notice through the bucket
        and save the step they reached (`notice.py`). A cluster run (`up --cluster`, or an
        older mncloud's on-demand run): its cluster torn down (`sky.down`)."""
        meta = require_meta(run_name)
        noticed = self._notice(meta, notice_s, by)
        try:
            status = self._down_cluster(meta) if meta.kind == CLUSTER else self._cancel_run(meta)
        finally:  # a failed cancel too: the job's restarts (exit 115) must not stop again
            if noticed is not None and meta.ckpt_uri:
                withdraw_notice(meta.ckpt_uri)
        if noticed is None:
            return status
        saved = f"step {noticed[1]} saved" if noticed[1] is not None else "no new step saved"
        note = f"stopped after a {noticed[0]:g}s notice ({saved})"
        return status.model_copy(update={"detail": f"{status.detail}; {note}".lstrip("; ")})

    def diagnose(self, folder: Path) -> str | None:
        """A torn JSON file of the run folder (its meta among them)."""
        return first_unreadable(folder, sorted(folder.glob("*.json")), {})

    def ckpt_uri_of(self, run_name: str, run_id: str) -> str | None:
        """None: a cloud run's record holds its checkpoint URI (there is no default)."""
        return None

    def legacy_steps(self, run_name: str, run_id: str) -> list[StepMark] | None:
        """None: cloud runs only ever wrote telemetry segments."""
        return None

    def launch_took(self, run_name: str, run_id: str) -> bool:
        """True: SkyPilot answering `status` for the run is the proof (a journaled launch is
        found in its queue by run id, `control/identity.py`)."""
        return True

    def take_node(self, run_name: str, node: int, *, by: str) -> None:
        """BackendError: a cloud takes its VMs itself."""
        raise BackendError(f"{self.name} cannot take node {node} of {run_name}: the cloud does")

    def down_unrecorded(self, run_name: str) -> RunStatus:
        """Its live managed jobs of that exact name, cancelled by id (`down_unrecorded`)."""
        return down_unrecorded(run_name)

    def controller_host(self) -> ControllerHost:
        """SkyPilot's managed jobs queue: the controller is a job there (`host.py`)."""
        from mncloud.backends.skypilot.host import SkyPilotHost

        return SkyPilotHost()

    def rehearsal(self) -> Rehearsal:
        """None: a SkyPilot run's nodes are VMs elsewhere."""
        raise BackendError(
            "a SkyPilot run is not a rehearsal on this machine: follow it with "
            "`mncloud logs NAME --follow` and `mncloud status NAME`"
        )

    def _cancel_run(self, meta: RunMeta) -> RunStatus:
        """Cancel the run's recorded job and any other live job of its name (a launch whose
        id never came back, one launched from elsewhere), by id; wait until they ended."""
        if meta.request_id is None and meta.job_id is None:  # nothing ever reached SkyPilot
            meta.downed_at = meta.downed_at or time.time()
            save_meta(meta)
            return status_from_meta(meta, RunState.FAILED, f"never launched: {meta.error}")
        recorded = [meta.job_id] if meta.job_id is not None else []
        try:
            found = live_job_ids(meta.name)
        except BackendError as err:
            still = f"managed job {meta.job_id} may still be live" if recorded else "unknown"
            raise BackendError(f"{err}; nothing was cancelled ({still})") from None
        cancelled = cancel_jobs([*recorded, *found])
        if meta.job_id is None and found:  # its launch never heard back: the newest is it
            meta.job_id = max(found)
        meta.downed_at = meta.downed_at or time.time()
        save_meta(meta)
        status = self.status(meta.name)
        if cancelled:
            what = f"cancelled managed job{'s' if len(cancelled) > 1 else ''} {_ids(cancelled)}"
        else:
            what = "nothing to cancel: no job of the run is live"
        status.detail = f"{what}; {status.detail}".rstrip("; ")
        return status

    def _down_cluster(self, meta: RunMeta) -> RunStatus:
        """Tear down a run's cluster (`up --cluster`, or an older mncloud's on-demand run)."""
        import sky

        if meta.error is None or meta.idle_minutes is not None:  # a failed `--cluster` launch
            try:  # may still have left a cluster up: down asks SkyPilot all the same
                with sky_errors(f"tear down {meta.name}"):
                    sky.get(sky.down(meta.name))
            except RunNotFoundError:
                pass  # SkyPilot has no such cluster: already gone, down is idempotent
        meta.downed_at = meta.downed_at or time.time()
        final = meta.last_state if meta.last_state and meta.last_state.is_final else None
        status = status_from_meta(
            meta, final or RunState.CANCELLED, "cluster torn down; checkpoints stay"
        )
        record_end(meta, status)
        save_meta(meta)
        return status

    def _notice(self, meta: RunMeta, notice_s: float, by: str) -> tuple[float, int | None] | None:
        """Give a running job its stop notice: (the notice, the step saved), or None if none
        was given (no notice asked, no bucket, or the job is not running)."""
        if notice_s <= 0 or meta.error is not None or not meta.ckpt_uri:
            return None
        try:
            if self.status(meta.name).state is not RunState.RUNNING:
                return None
        except MncloudError:
            return None
        saved = give_notice(meta.ckpt_uri, notice_s, lambda: self.status(meta.name).state, by)
        return notice_s, saved


def _what_to_launch(request: LaunchRequest) -> tuple[sky.Task | sky.Dag, list[str]]:
    """What `sky.jobs.launch` gets: the run's task, or (`--recovery node`) the job group's
    DAG (`mncloud/render/jobgroup.py`) and its task names; the only difference between them."""
    if not request.task.documents:
        return build_task(request), []
    dag = build_dag(request)
    return dag, [str(task.name) for task in dag.tasks]


def _record_launch(request: LaunchRequest, meta: RunMeta) -> None:
    """The run record's `launch` event (`events.py`), unless the caller records its own."""
    if request.record_events and request.run_id:
        meta.records_events, meta.run_id = True, request.run_id
        save_meta(meta)
        record_launch(meta)


def _ids(job_ids: list[int]) -> str:
    return ", ".join(str(i) for i in job_ids)


def down_unrecorded(run_name: str) -> RunStatus:
    """`down` of a run this machine holds no SkyPilot record of (its controller's VM launched
    it, or another machine did): its live managed jobs, found by their exact name in
    SkyPilot's queue, cancelled by id. RunNotFoundError when SkyPilot knows no job of that
    name, or its API server is local and not running (it is not started for this)."""
    url, ask = server_to_ask()
    if not ask:
        raise RunNotFoundError(
            f"no run {run_name!r}: mncloud has no record of it, and SkyPilot's API server "
            f"({url}) is not running to ask for its jobs (`sky api start` if another "
            "machine launched it)"
        )
    found = jobs_named(run_name, live_only=False)
    if not found:
        raise RunNotFoundError(
            f"no run {run_name!r}: neither mncloud nor SkyPilot knows it; `mncloud status` "
            "lists the runs, `sky jobs queue` SkyPilot's jobs"
        )
    cancelled = cancel_jobs(found)
    if cancelled:
        what = f"cancelled managed job{'s' if len(cancelled) > 1 else ''} {_ids(cancelled)}"
    else:
        what = f"nothing to cancel: its managed jobs ({_ids(found)}) had ended"
    return RunStatus(
        name=run_name,
        backend=BACKEND_NAME,
        state=RunState.CANCELLED,
        nodes=0,
        ended_at=time.time(),
        detail=f"{what} (named {run_name}; no record of the run on this machine)",
    )
