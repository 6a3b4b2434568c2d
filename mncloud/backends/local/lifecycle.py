"""Start, watch and stop a local run folder: write it, start its supervisor, take it down.

`stop_folder` is what `mncloud down` does. Gracefully (`notice_s` > 0, `down`'s default), it
first gives the run a preemption notice: a `stop` request in chaos.jsonl and SIGUSR1 to the
supervisor, which announces the notice to every node through the run's metadata server, so
every rank saves the step it reached (the emergency checkpoint path) and exits 115; the
supervisor records CANCELLED and exits. Example, 2 nodes training, `mncloud down demo`:

    t=0     stop request (notice 30 s); SIGUSR1 → the supervisor flips every node's metadata
    t=0.5   the ranks' watchers see it; at the next step all ranks save that step, exit 115
    t=2     every node gone: "stopped by mncloud down after a preemption notice; newest
            complete checkpoint: step 137"; the supervisor exits
    t=30    (only for a node that ignored the notice) the notice's deadline: SIGKILL

Nodes that never asked their metadata (a script without a CheckpointManager, node recovery,
where the watch is off, or a run still starting) are not waited for: the stop is immediate.
Then, as `down --now` does at once: SIGTERM to the supervisor (it SIGKILLs every node process
and records CANCELLED), a bounded wait until no process of the run is left, and SIGKILL to
whatever still runs after `STOP_GRACE_S` (found by the run's tag, the supervisor's included),
so no process survives `down`, whatever phase the run was in.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import psutil
from pydantic import BaseModel

from mncloud import constants, layout
from mncloud.backends.base import RunState
from mncloud.backends.local import processes
from mncloud.backends.local.state import (
    CHAOS_FILE,
    REFERENCE_DIR,
    SUPERVISOR_LOG,
    TASK_FILE,
    LocalLaunch,
    LocalState,
    append_jsonl,
    load_launch,
    load_state,
    save_launch,
    save_state,
)
from mncloud.errors import BackendError, RunNotFoundError

STOP_GRACE_S = 10.0
"""How long `down` lets the run's processes exit before it SIGKILLs them."""
GRACEFUL_STOP_SIGNAL = signal.SIGUSR1
"""Tells the supervisor to read the stop request in chaos.jsonl (SIGTERM stops at once)."""
KEEP = ("backend.json", layout.LOCAL_CKPT_DIR, layout.CONTROL_DIR)
"""What a fresh launch leaves in the run folder: the backend choice, local checkpoints
(`up --resume` continues from them; `up --replace` sets them aside first) and the deadline
controller's folder (it relaunches the run as it switches markets)."""
# Supervisor children kept referenced so Python reaps them (no zombie, no ResourceWarning).
_CHILDREN: list[subprocess.Popen[bytes]] = []


class StopReport(BaseModel):
    """What `stop_folder` found and did."""

    processes: int = 0
    """Processes of the run (supervisor included) running when `down` began."""
    killed: list[int] = []
    """Pids still running after the grace period, SIGKILLed."""
    seconds: float = 0.0
    left: list[int] = []
    """Pids that survived even SIGKILL (should never happen)."""
    notice_s: float = 0.0
    """The preemption notice the run was given before it was stopped (0: none)."""

    def describe(self) -> str:
        if self.left:
            return f"{len(self.left)} process(es) of the run survived SIGKILL: {self.left}"
        if not self.processes:
            return "no process of the run was running"
        killed = f"; {len(self.killed)} SIGKILLed after {STOP_GRACE_S:g}s" if self.killed else ""
        notice = f" (after a {self.notice_s:g}s preemption notice)" if self.notice_s else ""
        return (
            f"all {self.processes} process(es) of the run gone in {self.seconds:.1f}s"
            f"{notice}{killed}"
        )


def supervisor_alive(state: LocalState) -> bool:
    return processes.is_supervisor(state.supervisor_pid)


def supervisor_pids(state: LocalState) -> set[int]:
    """The run's live supervisor: by its pid in state.json, or by its tag (one that has not
    written its pid yet)."""
    found = set(processes.tagged_pids(state.token, processes.SUPERVISOR_NODE))
    if supervisor_alive(state):
        found.add(state.supervisor_pid or 0)
    return found


def launch_alive(folder: Path) -> bool:
    """True while the run in `folder` is not final and its supervisor runs (or is starting)."""
    try:
        state = load_state(folder)
    except RunNotFoundError:
        return False
    return not state.state.is_final and bool(supervisor_pids(state))


def run_ended(folder: Path) -> bool:
    """True once the run is final or its supervisor is gone (nothing more will happen)."""
    state = load_state(folder)
    return state.state.is_final or not supervisor_alive(state)


def wait_for(check: Callable[[], object], timeout: float, interval: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(interval)
    return bool(check())


def prepare_run(
    folder: Path, launch: LocalLaunch, task_yaml: str, keep: tuple[str, ...] = KEEP
) -> None:
    """Write a fresh run folder: launch.json, the task and its scripts, a PENDING state.
    What the folder held before goes, except the names in `keep` (and set-aside checkpoints)."""
    for child in folder.iterdir() if folder.is_dir() else []:
        if child.name in keep or child.name.startswith(f"{layout.LOCAL_CKPT_DIR}."):
            continue
        if child.is_dir() and not child.is_symlink():
            shutil.rmtree(child)
        else:
            child.unlink()
    folder.mkdir(parents=True, exist_ok=True)
    (folder / TASK_FILE).write_text(task_yaml)
    (folder / "run.sh").write_text(launch.run)
    if launch.setup:
        (folder / "setup.sh").write_text(launch.setup)
    save_launch(folder, launch)
    state = LocalState(
        name=launch.name,
        token=launch.token,
        num_nodes=launch.num_nodes,
        procs_per_node=launch.procs_per_node,
        master_port=launch.master_port,
        ckpt_uri=launch.ckpt_uri,
        task_id=launch.task_id,
        detail="starting the supervisor",
    )
    save_state(folder, state)


def start_supervised(folder: Path) -> LocalState:
    """Start the supervisor of a prepared run folder (detached, so `up --detach` can
    return); return its first state."""
    token = load_launch(folder).token
    env = dict(os.environ)
    env[constants.LOCAL_NODE_TAG_ENV] = processes.node_tag(token, processes.SUPERVISOR_NODE)
    with open(folder / SUPERVISOR_LOG, "ab") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", processes.SUPERVISOR_MODULE, "supervise", str(folder)],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # survives the terminal of `up`
        )
    _CHILDREN.append(proc)
    wait_for(lambda: load_state(folder).supervisor_pid is not None or proc.poll() is not None, 30)
    state = load_state(folder)
    if state.supervisor_pid is None:
        log_lines = (folder / SUPERVISOR_LOG).read_text(errors="replace").strip().splitlines()
        last = log_lines[-1] if log_lines else "no output"
        raise BackendError(f"the local supervisor did not start: {last}")
    return state


def wait_for_running(folder: Path, timeout: float = 600.0) -> LocalState:
    """Wait until the run's nodes are up (RUNNING) or the run ended; return its state."""
    deadline = time.monotonic() + timeout
    while True:
        state = load_state(folder)
        if state.state is RunState.RUNNING or state.state.is_final:
            return state
        if state.supervisor_pid is not None and not supervisor_alive(state):
            raise BackendError(f"the supervisor of {state.name} is gone; see {SUPERVISOR_LOG}")
        if time.monotonic() > deadline:
            raise BackendError(f"run {state.name} not RUNNING after {timeout:g}s ({state.detail})")
        time.sleep(0.05)


def stop_folder(
    folder: Path, grace: float = STOP_GRACE_S, *, notice_s: float = 0.0, by: str = "mncloud down"
) -> StopReport:
    """Stop the supervisor and every process of a run folder; return once none is left.

    With `notice_s`, a preemption notice first (see the module docstring): up to `notice_s`
    + `grace` for the supervisor to stop the nodes that way and exit. Then SIGTERM to the
    supervisor, up to `grace` seconds for it and the nodes to go, then SIGKILL to whatever of
    the run still runs (found by tag again: nothing escapes by forking late).
    """
    try:
        state = load_state(folder)
    except RunNotFoundError:
        return StopReport()
    t0 = time.monotonic()
    supervisors = supervisor_pids(state)
    pids = set(processes.tagged_pids(state.token)) | supervisors
    given = 0.0
    if notice_s > 0 and supervisors and not state.state.is_final:
        asked = time.time()
        _request_graceful_stop(folder, supervisors, notice_s, by)
        processes.wait_gone(supervisors, notice_s + grace)
        after = load_state(folder)
        supervisors = supervisor_pids(after) & supervisors
        # The supervisor gives the notice only when some node watches for one.
        if any(e.kind == "notice" and e.t >= asked - 1 for e in after.events):
            given = notice_s
    for pid in supervisors:
        with contextlib.suppress(psutil.Error):
            psutil.Process(pid).terminate()
    left = set(processes.wait_gone(pids, grace))
    for pid in left & supervisors:
        with contextlib.suppress(psutil.Error):
            psutil.Process(pid).kill()
    killed = left | set(processes.kill_tagged(state.token))
    survivors = processes.wait_gone(killed | pids, 5.0)
    _reap_children()
    _mark_cancelled(folder, by)
    report = StopReport(processes=len(pids), killed=sorted(killed), left=survivors, notice_s=given)
    report.seconds = round(time.monotonic() - t0, 2)
    return report


def _request_graceful_stop(folder: Path, supervisors: set[int], notice_s: float, by: str) -> None:
    """The stop request the supervisor reads (chaos.jsonl), then the signal that wakes it."""
    now = time.time()
    append_jsonl(folder / CHAOS_FILE, {
        "t": now, "action": "stop", "notice_s": notice_s, "deadline": now + notice_s, "by": by,
        "message": f"{by}: a preemption notice to every node; they stop in {notice_s:g}s",
    })  # fmt: skip
    for pid in supervisors:
        with contextlib.suppress(psutil.Error):
            psutil.Process(pid).send_signal(GRACEFUL_STOP_SIGNAL)


def _reap_children() -> None:
    """Reap supervisors this process started (a test or `up` in the foreground)."""
    for proc in list(_CHILDREN):
        if proc.poll() is not None:
            _CHILDREN.remove(proc)


def _mark_cancelled(folder: Path, by: str = "mncloud down") -> None:
    state = load_state(folder)
    if not state.state.is_final:
        state.state, state.ended_at = RunState.CANCELLED, time.time()
        state.detail = f"stopped by {by}"
        save_state(folder, state)


def start_reference(run_name: str) -> Path:
    """Start the same task once more, without chaos, in `<run folder>/reference/`.

    Same rendered run script, nodes, processes and thread count; its own port, task id and
    local checkpoint folder; no recovery. Its final.json is the uninterrupted reference.
    """
    folder = layout.run_dir(run_name)
    launch = load_launch(folder)
    ref = folder / REFERENCE_DIR
    ref_launch = launch.model_copy(
        update={
            "name": f"{run_name}-reference",
            "token": uuid.uuid4().hex[:12],
            "task_id": f"{launch.task_id}-reference",
            "run_id": None,
            "master_port": processes.free_port(),
            "ckpt_uri": f"file://{ref / layout.LOCAL_CKPT_DIR}",
            "chaos_preempt_after": None,
            "max_restarts": 0,
            "setup": None,  # ran already for this run
        }
    )
    prepare_run(ref, ref_launch, (folder / TASK_FILE).read_text(), keep=())
    start_supervised(ref)
    return ref
