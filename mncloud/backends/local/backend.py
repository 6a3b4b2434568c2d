"""`LocalBackend`: the `Backend` interface over a local run folder and its supervisor.

`launch` turns the rendered task into launch.json and starts the supervisor; `status`,
`logs` and `down` read and stop it; `progress` and `run_reference` are what the CLI shows
while a local run goes and at its end (the CLI never reads the run folder itself).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mncloud import constants, layout
from mncloud.backends.base import Failure, LaunchRequest, RunState, RunStatus, first_unreadable
from mncloud.backends.local import execute, figures, lifecycle, warm
from mncloud.backends.local.processes import free_port, port_is_free
from mncloud.backends.local.resumecheck import SCRATCH
from mncloud.backends.local.state import (
    LAUNCH_FILE,
    LOG_MARKS,
    REFERENCE_DIR,
    RUN_LOG,
    STATE_FILE,
    SUPERVISOR_LOG,
    LocalLaunch,
    LocalState,
    load_launch,
    load_state,
    node_log,
    read_jsonl,
)
from mncloud.errors import BackendError, MncloudError, RunNotFoundError
from mncloud.spec import JobSpec, min_replicas

if TYPE_CHECKING:
    from mncloud.backends.base import ControllerHost, ReferenceResult, Rehearsal, RunProgress
    from mncloud.records.goodput import StepMark


def _check_can_launch(request: LaunchRequest) -> None:
    """BackendError for what would stop the run at once: a live run of the same name,
    no launcher (torchrun, accelerate, deepspeed), a taken port, a missing secret."""
    spec = request.spec
    with contextlib.suppress(RunNotFoundError):
        old = load_state(layout.run_dir(spec.name))
        if not old.state.is_final and lifecycle.supervisor_alive(old):
            raise BackendError(
                f"run {spec.name!r} is still {old.state.value}; stop it with "
                f"`mncloud down {spec.name}` or pick another --name"
            )
    launcher = spec.launcher.value
    here = shutil.which(launcher, path=str(Path(sys.executable).parent))
    if launcher != "none" and here is None and shutil.which(launcher) is None:
        hint = "'mncloud[train]' (torch)" if launcher == "torchrun" else launcher
        raise BackendError(
            f"{launcher} not found: the local nodes run on this machine; pip install {hint}"
        )
    if not port_is_free(spec.rendezvous_port):
        raise BackendError(
            f"port {spec.rendezvous_port} on 127.0.0.1 is in use; pass --master-port with a "
            "free port (another run may hold it)"
        )
    missing = [k for k in request.task.config.get("secrets") or {} if k not in os.environ]
    if missing:
        raise BackendError(f"--secret {missing[0]} is not set in your environment; export it")


def launch_record(request: LaunchRequest) -> LocalLaunch:
    """The launch.json of a request: the rendered task plus the local options."""
    spec, config, opts = request.spec, request.task.config, request.options
    envs = {str(k): str(v) for k, v in (config.get("envs") or {}).items()}
    nodes, procs = int(config.get("num_nodes", spec.nodes)), spec.procs_per_node
    local_ckpt = f"file://{layout.local_ckpt_dir(spec.name)}"
    return LocalLaunch(
        name=spec.name,
        token=uuid.uuid4().hex[:12],
        task_id=f"sky-{datetime.now():%Y-%m-%d-%H-%M-%S-%f}_{spec.name}_1",
        run_id=request.run_id,
        workdir=str(config.get("workdir") or spec.workdir),
        setup=config.get("setup"),
        run=str(config["run"]),
        envs=envs,
        num_nodes=nodes,
        procs_per_node=procs,
        master_port=spec.rendezvous_port,
        ckpt_uri=envs.get(constants.CKPT_URI_ENV) or local_ckpt,
        max_restarts=spec.max_restarts,
        recovery_delay=opts.recovery_delay,
        chaos_preempt_after=opts.chaos_preempt_after,
        preflight_always=opts.preflight_always,
        cpu_threads=max(1, (os.cpu_count() or 1) // (nodes * procs)),
        storage_endpoint=os.environ.get("AWS_ENDPOINT_URL")
        or os.environ.get("STORAGE_EMULATOR_HOST"),
        spot=request.task.spot,
        hourly_price=opts.hourly_price or 0.0,
        recovery=spec.recovery.value,
        min_replicas=min_replicas(nodes),
        idle_s=_idle_s(opts.idle_minutes) if opts.cluster else None,
    )


def _idle_s(idle_minutes: int) -> float:
    """A `--cluster` run's warm hosts' idle time (`constants.LOCAL_HOST_IDLE_ENV` overrides)."""
    override = os.environ.get(constants.LOCAL_HOST_IDLE_ENV, "")
    try:
        return max(0.0, float(override)) if override else idle_minutes * 60.0
    except ValueError:
        raise BackendError(
            f"{constants.LOCAL_HOST_IDLE_ENV}={override!r}: give a number of seconds"
        ) from None


def _node_view(folder: Path, state: LocalState) -> dict[str, Any]:
    """Node recovery's part of a status: each node's state and the quorum."""
    try:
        if load_launch(folder).recovery != "node":
            return {}
    except (OSError, ValueError):  # a run folder without its launch.json: no node view
        return {}
    return {
        "recovery": "node",
        "node_states": {n.node: n.status for n in state.nodes},
        "quorum": list(state.quorum),
    }


class LocalBackend:
    """Runs the rendered task on N local nodes under a supervisor process."""

    name = "local"
    records_own_events = True
    """The supervisor writes every relaunch and the end to the run record."""
    runs_here = True

    def settled(self, spec: JobSpec) -> JobSpec:
        """Without --master-port, a free port on this machine (local runs side by side)."""
        if spec.master_port is not None:
            return spec
        return spec.updated(master_port=free_port())

    def launch(self, request: LaunchRequest) -> RunStatus:
        _check_can_launch(request)
        launch = launch_record(request)
        if request.dryrun:
            nodes, procs = launch.num_nodes, launch.procs_per_node
            return RunStatus(
                name=launch.name, backend=self.name, state=RunState.PENDING, nodes=nodes,
                cloud="local", instance_type=f"cpu:{procs}", hourly_total=0.0,
                ckpt_uri=launch.ckpt_uri,
                detail=f"dry run: would start {nodes} local node(s) × {procs} process(es)",
            )  # fmt: skip
        folder = layout.run_dir(launch.name)
        warm.stop_hosts(folder)  # an earlier --cluster run's hosts: the folder is rewritten
        lifecycle.prepare_run(folder, launch, request.task.yaml_text)
        lifecycle.start_supervised(folder)
        return self.status(launch.name)

    def exec(self, request: LaunchRequest) -> RunStatus:
        """`mncloud exec`: the task again on the run's own nodes, no setup (`execute.py`)."""
        launch = execute.exec_launch(request, launch_record(request))
        execute.start_exec(request, launch)
        return self.status(launch.name)

    def measure_bandwidth(
        self, run_name: str, minimum: float | None, timeout: float
    ) -> tuple[bool, list[str]]:
        """`doctor --bandwidth`: the test across the run's local nodes (`netcheck.py`)."""
        from mncloud.backends.local.netcheck import measure

        return measure(run_name, minimum, timeout)

    def status(self, run_name: str) -> RunStatus:
        folder = layout.run_dir(run_name)
        state = load_state(folder)
        if not state.state.is_final and not lifecycle.supervisor_alive(state):
            # Re-read: the supervisor may have written its final state just before exiting.
            state = load_state(folder)
            if not state.state.is_final and state.supervisor_pid:
                state.state = RunState.FAILED
                state.detail = (
                    f"the supervisor stopped unexpectedly (see {folder / SUPERVISOR_LOG}); "
                    f"`mncloud down {run_name}` cleans up"
                )
        restarts = [e.message for e in state.events if e.kind == SCRATCH]
        detail = "; ".join([*restarts, state.detail] if state.detail else restarts)
        note = warm.idle_note(folder) if state.state.is_final else None
        if note:
            detail = f"{detail}; {note}" if detail else note
        return RunStatus(
            name=run_name, backend=self.name, state=state.state, nodes=state.num_nodes,
            cloud="local", instance_type=f"cpu:{state.procs_per_node}", spot=None,
            restarts=state.restarts, preemptions=state.preemptions,
            started_at=state.started_at, ended_at=state.ended_at, hourly_total=0.0,
            ckpt_uri=state.ckpt_uri, detail=detail, **_node_view(folder, state),
            failure=Failure.REFUSED if state.refused else None,
        )  # fmt: skip

    def logs(
        self,
        run_name: str,
        node: int | None = None,
        follow: bool = False,
        *,
        since: float | None = None,
    ) -> Iterator[str]:
        """The run's lines (one node's with `node`); with `since` (a time), those written
        from then on, to the second (run.log's marks), a node's picked out of run.log."""
        folder = layout.run_dir(run_name)
        state = load_state(folder)
        if node is not None and not 0 <= node < state.num_nodes:
            raise BackendError(f"--node {node}: run {run_name} has nodes 0..{state.num_nodes - 1}")
        done = lambda: lifecycle.run_ended(folder)  # noqa: E731
        if since is None:
            path = folder / (RUN_LOG if node is None else node_log(node))
            yield from tail_lines(path, follow=follow, done=done)
            return
        lines = tail_lines(
            folder / RUN_LOG, follow=follow, done=done, start=_offset_at(folder, since)
        )
        prefixes = (f"[node {node}]", f"[node {node} ")
        for line in lines:
            if node is None or line.startswith(prefixes):
                yield line

    def down(self, run_name: str, *, notice_s: float = 0.0, by: str = "mncloud down") -> RunStatus:
        """Stop the run and wait (bounded) until none of its processes is left; the status's
        detail says how that went. With `notice_s`, the nodes first get a preemption notice
        and that long to save the step they reached (`lifecycle.stop_folder`)."""
        folder = layout.run_dir(run_name)
        load_state(folder)  # RunNotFoundError for an unknown run
        lifecycle.stop_folder(folder / REFERENCE_DIR)
        report = lifecycle.stop_folder(folder, notice_s=notice_s, by=by)
        hosts = warm.stop_hosts(folder)  # the local cluster itself
        status = self.status(run_name)
        said = report.describe() + (f"; {hosts} warm host process(es) stopped" if hosts else "")
        status.detail = f"{status.detail}; {said}" if status.detail else said
        if report.left:
            raise BackendError(f"mncloud down {run_name}: {report.describe()}")
        return status

    def diagnose(self, folder: Path) -> str | None:
        """A torn or foreign launch.json / state.json (or other JSON file) of the folder, or
        a state.json its launch never wrote (it stopped before the run started)."""
        models = {STATE_FILE: LocalState, LAUNCH_FILE: LocalLaunch}
        found = first_unreadable(folder, sorted(folder.glob("*.json")), models)
        if found is None and not (folder / STATE_FILE).is_file():
            return f"{STATE_FILE} is missing: its launch stopped before the run started ({folder})"
        return found

    def ckpt_uri_of(self, run_name: str, run_id: str) -> str | None:
        """The run folder's checkpoint URI (its `file://` default unless `--bucket`), while
        the folder holds launch `run_id`."""
        folder = layout.run_dir(run_name)
        if _launch_id(folder) != run_id:
            return None
        try:
            return load_state(folder).ckpt_uri
        except (MncloudError, *_FILE_ERRORS):
            return None

    def legacy_steps(self, run_name: str, run_id: str) -> list[StepMark] | None:
        """Rank 0's `progress.jsonl` steps, while the run folder holds launch `run_id`."""
        from pydantic import ValidationError

        from mncloud.records.goodput import StepMark

        folder = layout.run_dir(run_name)
        if _launch_id(folder) != run_id:
            return None
        marks = []
        for line in read_jsonl(folder / "progress.jsonl"):
            if isinstance(line, dict) and "step" in line and "event" not in line:
                with contextlib.suppress(ValidationError):
                    marks.append(StepMark.model_validate(line))
        return marks

    def launch_took(self, run_name: str, run_id: str) -> bool:
        """The run folder holds launch `run_id` and it got as far as its supervisor (alive or
        over)."""
        folder = layout.run_dir(run_name)
        try:
            launch, local = load_launch(folder), load_state(folder)
        except (OSError, ValueError, MncloudError):
            return False
        if launch.run_id != run_id:
            return False
        return local.supervisor_pid is not None or lifecycle.launch_alive(folder)

    def take_node(self, run_name: str, node: int, *, by: str) -> None:
        """SIGKILL to the node's processes (`chaos.preempt_node`): the supervisor records it."""
        from mncloud.backends.local.chaos import preempt_node

        preempt_node(layout.run_dir(run_name), node, by=by)

    def down_unrecorded(self, run_name: str) -> RunStatus:
        """A local run always has its folder here: with none, there is no such run."""
        raise RunNotFoundError(f"no local run named {run_name!r}")

    def controller_host(self) -> ControllerHost:
        """None: a local run's deadline controller is a process here (`control/keeper.py`)."""
        raise BackendError(
            "a local run's deadline controller is a process on this machine, not a job on a "
            "controller host: `mncloud status NAME` and `mncloud down NAME` reach it"
        )

    def rehearsal(self) -> Rehearsal:
        """This backend: its runs are rehearsals on this machine."""
        return self

    def progress(self, run_name: str, *, summary: bool = False) -> RunProgress:
        """Where the run is (step, attempt, restarts); with `summary`, its recovery figures."""
        return figures.progress_of(layout.run_dir(run_name), run_name, summary=summary)

    def run_reference(
        self, run_name: str, on_progress: Callable[[RunProgress], None]
    ) -> ReferenceResult:
        """Run the same task once more without chaos and wait for it (see figures.py)."""
        return figures.run_reference(run_name, on_progress)


#: Errors of a run folder's own files (torn JSON, a schema they do not match, a lost file).
_FILE_ERRORS = (OSError, ValueError, KeyError, TypeError)


def _launch_id(folder: Path) -> str | None:
    """The run record id of the launch a run folder holds."""
    try:
        return load_launch(folder).run_id
    except (OSError, ValueError):
        return None


def _offset_at(folder: Path, since: float) -> int:
    """Where in run.log the lines written at `since` or later start: the newest mark at or
    before `since` (so up to a second of older lines), 0 without marks; past the end when
    nothing was written since."""
    marks = read_jsonl(folder / LOG_MARKS)
    if not marks:  # a run from before marks were kept: its lines' times are unknown
        return 0
    offset, marked_at = 0, None
    for mark in marks:
        if mark.get("t", 0) > since + 1e-3:  # a time written from a mark's own reads back as it
            return offset
        offset, marked_at = int(mark.get("offset", 0)), float(mark.get("t", 0))
    if marked_at is not None and since - marked_at < 1.0:  # lines after it: within a second
        return offset
    path = folder / RUN_LOG
    return path.stat().st_size if path.is_file() else 0


def tail_lines(
    path: Path, *, follow: bool, done: Callable[[], bool], poll: float = 0.2, start: int = 0
) -> Iterator[str]:
    """Lines of a growing file from byte `start`; with `follow`, until `done()` and the file
    stops growing."""
    while follow and not path.exists() and not done():
        time.sleep(poll)
    if not path.exists():
        return
    with open(path, errors="replace", encoding="utf-8") as f:
        if start:
            f.seek(start)  # a byte offset at a line's start (UTF-8 keeps no decoder state)
        buffer = ""
        while True:
            chunk = f.readline()
            if chunk:
                buffer += chunk
                if buffer.endswith("\n"):
                    yield buffer.rstrip("\n")
                    buffer = ""
                continue
            if not follow:
                break
            if done():
                yield from (buffer + f.read()).splitlines()
                return
            time.sleep(poll)
        if buffer:
            yield buffer
