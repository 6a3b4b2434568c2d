"""A job group (`--recovery node`, `mncloud/render/jobgroup.py`) through SkyPilot: its status
and logs (its dry run is in `dryrun.py`). One managed job id covers every task:
`sky.jobs.cancel` ends them all, and `sky.jobs.queue_v2` answers one record per task.

The run's state is its node tasks' (the primaries), the most telling first: a failed node
fails the run; all done is done; one recovering node (the others training on) is RECOVERING;
then RUNNING, STARTING, PENDING. The lighthouse is shown in the detail. It is an auxiliary
task: SkyPilot ends it once the nodes are done and, when it fails for good (past its own
restarts), leaves the nodes running. So a failed lighthouse does not fail the run, whose nodes
still train and bill; the detail leads with it, since no lost node can be replaced after it.

The ledger follows the node tasks' queue times as a plain managed job's (`group_times`). A
plain run's group that failed while other nodes still train (SkyPilot leaves them running) is
cancelled by its `status` (`cancel_failed_rest`); its record bills until they ended.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from mncloud.backends.base import RunState, RunStatus
from mncloud.backends.skypilot.errors import one_line, sky_errors
from mncloud.backends.skypilot.logs import prefixed_lines
from mncloud.backends.skypilot.meta import RunMeta, status_from_meta
from mncloud.backends.skypilot.status import (
    MANAGED_JOB_STATES,
    QUEUE_FIELDS,
    failure_of,
    queue_records,
    queue_times,
    state_of,
    vanished,
)
from mncloud.errors import BackendError

if TYPE_CHECKING:
    from mncloud.records.ledger import RunTimes

_SEVERITY = [
    RunState.FAILED,
    RunState.CANCELLED,
    RunState.RECOVERING,
    RunState.RUNNING,
    RunState.STARTING,
    RunState.PENDING,
]


def group_state(states: list[RunState]) -> RunState:
    """The run's state from its node tasks' states (see the module docstring)."""
    if not states:
        return RunState.PENDING
    if all(state is RunState.SUCCEEDED for state in states):
        return RunState.SUCCEEDED
    for state in _SEVERITY:
        if state in states:
            return state
    return RunState.RUNNING  # some succeeded, the rest not in the list above


def job_group_status(meta: RunMeta) -> RunStatus:
    """A job group's status: every task's record, the node tasks deciding the state."""
    fields = [*QUEUE_FIELDS, "task_name", "is_primary_in_job_group"]
    records = queue_records(meta, fields, f"job group {meta.name}")
    mine = {_name(r): r for r in records if _field(r, "job_id") == meta.job_id}
    if not mine:
        return vanished(meta)
    nodes = [mine[t] for t in meta.tasks[1:] if t in mine]
    states = [state_of(_field(r, "status"), MANAGED_JOB_STATES) for r in nodes]
    state = group_state(states)
    restarts = sum(int(_field(r, "recovery_count") or 0) for r in nodes)
    parts = []
    for task in meta.tasks:
        record = mine.get(task)
        raw = _raw(_field(record, "status")) if record is not None else "unknown"
        count = int(_field(record, "recovery_count") or 0) if record is not None else 0
        parts.append(f"{_label(meta, task)} {raw}" + (f" ({count} recoveries)" if count else ""))
    detail = f"job group {meta.job_id}: " + ", ".join(parts)
    lighthouse = mine.get(meta.tasks[0]) if meta.tasks else None
    lost = _raw(_field(lighthouse, "status")) if lighthouse is not None else ""
    if lost.startswith("FAILED") and not state.is_final:
        detail = f"lighthouse {lost}: a lost node can no longer be replaced; {detail}"
    reasons = [_field(r, "failure_reason") for r in mine.values() if _field(r, "failure_reason")]
    if reasons:
        detail += f"; {one_line(reasons[0], 160)}"
    first = next(iter(nodes), None)
    meta.cloud = (_field(first, "cloud") if first else None) or meta.cloud
    meta.region = (_field(first, "region") if first else None) or meta.region
    status = status_from_meta(meta, state, detail)
    failures = [failure_of(_field(r, "status")) for r in nodes]
    status.failure = next((f for f in failures if f is not None), None)
    status.restarts = restarts
    status.node_states = {n: _node_state(s) for n, s in enumerate(states)}
    starts = [_field(r, "start_at") or _field(r, "submitted_at") for r in nodes]
    status.started_at = min((s for s in starts if s), default=meta.launched_at)
    ends = [_field(r, "end_at") for r in nodes]
    if state.is_final and ends and all(ends):
        status.ended_at = max(ends)
    status.times = group_times(nodes)
    return status


def cancel_failed_rest(meta: RunMeta, status: RunStatus) -> RunStatus:
    """A plain run's group whose node FAILED past its restarts while other tasks still run:
    SkyPilot keeps those training and billing, and nothing steers them, so the whole group is
    cancelled, by id (a deadline controller does its own, `control/outcomes.py`). Its record
    ends at SkyPilot's end of the last task (`events.follow_times`), not at the failure."""
    import sky

    live = [n for n, s in status.node_states.items() if s in ("running", "replacing", "starting")]
    if status.state is not RunState.FAILED or not live:
        return status  # (a CANCELLING task is not live here: cancelled once is enough)
    try:
        with sky_errors(f"cancel the rest of job group {meta.job_id}"):
            sky.get(sky.jobs.cancel(job_ids=[meta.job_id]))
    except BackendError as err:
        note = f"its other tasks still run and bill: `mncloud down {meta.name}` ({err})"
    else:
        note = "its other tasks cancelled (billed until SkyPilot ends them)"
    return status.model_copy(update={"detail": f"{status.detail}; {note}"})


_TIME_FIELDS = ("last_recovered_at", "job_duration", "end_at")


def group_times(nodes: list[Any]) -> RunTimes | None:
    """The node tasks' queue times as one job's, for the ledger, which prices all nodes at
    once: the run seconds are the nodes' mean (billed node-seconds = the sum of each node's);
    it runs while any node's VMs do, since the earliest of those stints; it ended when every
    node did. While one node is replaced the others' stint bills all nodes until the next
    look that closes or restarts it, which bills the mean again (the end is exact)."""
    from mncloud.records.ledger import RunTimes

    times = [queue_times({f: _field(r, f) for f in _TIME_FIELDS}, _raw(_field(r, "status")))
             for r in nodes]  # fmt: skip
    if not times:
        return None
    running = [t.since for t in times if t.running and t.since is not None]
    started = [t.since for t in times if t.since is not None]
    ends = [t.ended_at for t in times]
    return RunTimes(
        running=bool(running),
        ran_s=sum(t.ran_s for t in times) / len(times),
        since=min(running) if running else max(started, default=None),
        ended_at=max(e for e in ends if e) if all(ends) else None,
        recovering=not running and any(t.recovering for t in times),
    )


_NODE_STATES = {RunState.RUNNING: "running", RunState.RECOVERING: "replacing",
                RunState.SUCCEEDED: "finished"}  # fmt: skip


def _node_state(state: RunState) -> str:
    """A node task's state in `RunStatus.node_states` words."""
    return _NODE_STATES.get(state, "stopped" if state.is_final else "starting")


def _field(record: Any, name: str) -> Any:
    if record is None:
        return None
    return record.get(name) if isinstance(record, dict) else getattr(record, name, None)


def _name(record: Any) -> str:
    return str(_field(record, "task_name") or "")


def _raw(status: Any) -> str:
    return str(getattr(status, "value", status))


def _label(meta: RunMeta, task: str) -> str:
    """`lighthouse`, or `node K` for the task of replica K."""
    if task not in meta.tasks[1:]:
        return "lighthouse"
    return f"node {meta.tasks.index(task) - 1}"


# --------------------------------------------------------------------------------- logs


def tail_group_logs(meta: RunMeta, node: int | None, follow: bool) -> Iterator[str]:
    """The group's log lines, `[node K]` for node task K and `[lighthouse]` for the
    lighthouse; all tasks' streams merged as they come (`node`: that node's only)."""
    tasks = meta.tasks if node is None else [_node_task(meta, node)]
    streams = [_task_lines(meta, task, follow) for task in tasks]
    if len(streams) == 1:
        yield from streams[0]
        return
    yield from _merged(streams)


def _node_task(meta: RunMeta, node: int) -> str:
    nodes = meta.tasks[1:]
    if not 0 <= node < len(nodes):
        raise BackendError(f"{meta.name} has nodes 0 to {len(nodes) - 1}; there is no node {node}")
    return nodes[node]


def _task_lines(meta: RunMeta, task: str, follow: bool) -> Iterator[str]:
    import sky

    label = f"[{_label(meta, task)}]"
    with sky_errors(f"read the logs of {task}"):
        chunks = sky.jobs.tail_logs(
            job_id=meta.job_id, task=task, follow=follow, preload_content=False
        )
        for line in prefixed_lines(chunks, None):
            yield line.replace("[node 0]", label, 1) if line.startswith("[node 0]") else line


def _merged(streams: list[Iterator[str]]) -> Iterator[str]:
    """Lines of several streams as they come, each stream read by a thread of its own; an
    error in one is raised once every stream has ended."""
    lines: queue.Queue[tuple[int, str | None, BaseException | None]] = queue.Queue()

    def pump(index: int, stream: Iterator[str]) -> None:
        try:
            for line in stream:
                lines.put((index, line, None))
        except BaseException as err:  # handed to the reader
            lines.put((index, None, err))
            return
        lines.put((index, None, None))

    for index, stream in enumerate(streams):
        threading.Thread(target=pump, args=(index, stream), daemon=True).start()
    left, error = len(streams), None
    while left:
        _index, line, err = lines.get()
        if line is not None:
            yield line
            continue
        left -= 1
        error = error or err
    if error is not None:
        raise error
