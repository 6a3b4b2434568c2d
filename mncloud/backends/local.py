"""The local backend: the rendered SkyPilot task on N simulated nodes of this machine.

`mncloud up train.py --cloud local --nodes 2 --gpus cpu:2` renders the task exactly as for a
cloud; this module then executes *that* task: `setup` once per node, then `run` on every node
with the variables SkyPilot sets (`SKYPILOT_NODE_IPS` = N × 127.0.0.1, `SKYPILOT_NODE_RANK`,
`SKYPILOT_NUM_NODES`, `SKYPILOT_NUM_GPUS_PER_NODE`, `SKYPILOT_TASK_ID`, stable across
relaunches) plus `MNCLOUD_CKPT_URI` (`--bucket`, else `file://<run folder>/checkpoints`). The
nodes run real `torchrun` (gloo over loopback); each node is its own session and every process
in it carries `MNCLOUD_LOCAL_NODE=<run token>/<node>` in its environment, which is how the
supervisor, `mncloud chaos` and `mncloud down` find a node's processes, including workers that
torchrun put in sessions of their own and orphans that were reparented.

A supervisor process (`python -m mncloud.backends.local supervise <run folder>`, detached, so
`up --detach` can return) owns the run. It mirrors SkyPilot's managed-job recovery: a node that
*vanishes* (its launcher killed by a signal, as `chaos preempt` does) or exits with
`PREEMPTED_EXIT_CODE` is a preemption and is recovered; a node that exits non-zero on its own is
an error in the user's code and is retried only with `--retry-on-error` (SkyPilot's
`max_restarts_on_errors`). Every relaunch counts against `--max-restarts`. Example, 2 nodes,
`--recovery-delay 2s`:

    t=0     setup.sh on node 0, then node 1 (same folder, like a shared image)
    t=1     attempt 1: run.sh on both nodes; torchrun rendezvous on 127.0.0.1:<free port>
    t=20    `chaos preempt demo --node 1`: a line in chaos.jsonl, then SIGKILL to every process
            of node 1 (launcher, torchrun, workers)
    t=20.1  supervisor: node 1's launcher died of SIGKILL and chaos asked for it → preempted.
            It SIGKILLs node 0 too (a cloud tears the whole cluster down), restarts = 1.
    t=22    attempt 2: both nodes relaunched, same SKYPILOT_TASK_ID; the script's
            CheckpointManager.load() resumes from the newest COMPLETE step
    t=40    both nodes exit 0 → SUCCEEDED

Preemption *with notice*: the supervisor also runs one cloud metadata server for the run
(`mncloud.backends.metadata`, 127.0.0.1, a free port) and points every node at its own part of
it (`MNCLOUD_METADATA_URL=http://127.0.0.1:PORT/node/N`, `MNCLOUD_METADATA_PROTOCOL=all`: a
local node watches the AWS, GCP and Azure protocols at once, polled every 0.5 s) with
`MNCLOUD_PREEMPTION_WATCH=1` (unless `--env` sets it), so a running node can be warned at any
time. `chaos preempt demo --node 1 --notice 30s --cloud-protocol gcp` appends the request to
chaos.jsonl; the supervisor flips node 1's GCP `instance/preempted` to TRUE, and:

    t=0     node 1's watcher sees the notice; at the next step all 4 ranks agree (all-reduce)
            and save the same step, then exit 115 (`PREEMPTED_EXIT_CODE`)
    t=2     node 0 exits 115 first: the supervisor gives the other nodes up to 10 s to stop
            the same way, then counts one preemption and relaunches (resume: that step)
    t=30    the deadline: a node still running then is SIGKILLed (a notice the script ignored)

Each relaunch resets the metadata (fresh VMs).

`--chaos-preempt-after D` does what `chaos preempt` does to the last node, once, D after the
first training step the script reports in `$MNCLOUD_PROGRESS_FILE` (or D + 60 s after the
launch when it reports none), so the preemption lands mid-training however long start-up takes.
`mncloud down` stops the supervisor (SIGTERM; it SIGKILLs every node process and records
CANCELLED), then kills by tag whatever is left, so no process survives it.

Files in `$MNCLOUD_HOME/runs/<name>/`: `launch.json` (what to run), `state.json` (written only
by the supervisor, atomically: state, attempt, restarts, nodes and pids, events with times),
`chaos.jsonl` (requests from `mncloud chaos`, appended), `run.log` (all nodes, every line
prefixed `[node N rank R]`, kept across relaunches; `[node N]` for torchrun's own lines and
`[mncloud …]` for the supervisor's events), `node-N.log`, `progress.jsonl` (rank 0's steps,
if the script writes them), `supervisor.log`, `task.yaml`, `setup.sh`, `run.sh`, and
`nodes/node-N/` (each node's TMPDIR, checkpoint staging and torchrun log folder). Rank prefixes
come from torchrun itself (`--tee`, set through `PET_TEE` and
`TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE`, so the rendered task stays untouched); the supervisor
adds the node. A new `up` with the name of a finished run starts afresh (its folder, local
checkpoints included, is replaced); pass `--bucket` to keep checkpoints across runs.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import queue
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import IO, Any

from pydantic import BaseModel, Field

from mncloud import constants
from mncloud.backends.base import BACKEND_FILE, LaunchRequest, RunState, RunStatus, run_dir
from mncloud.errors import BackendError, RunNotFoundError
from mncloud.storage import write_atomic

LAUNCH_FILE = "launch.json"
STATE_FILE = "state.json"
CHAOS_FILE = "chaos.jsonl"
RUN_LOG = "run.log"
PROGRESS_FILE = "progress.jsonl"
SUPERVISOR_LOG = "supervisor.log"
FINAL_FILE = "final.json"
LOCALHOST = "127.0.0.1"
POLL_S = 0.1
NOTICE_POLL_S = 0.5
NOTICE_EXIT_GRACE_S = 10.0
"""After a node exits for a preemption notice, how long the others get to do the same."""
"""How often a local node polls its (simulated) metadata for a preemption notice."""
CHAOS_NO_PROGRESS_S = 60.0
_RANK_PREFIX = re.compile(r"^\[rank(\d+)\]:(.*)$", re.DOTALL)
# Supervisor event kinds → run-record event kinds (runs.py); "launch" is mapped by attempt.
_RECORD_KINDS = {"preempted": "preemption", "error": "failure", "succeeded": "finish",
                 "failed": "failure", "cancelled": "finish"}  # fmt: skip
# Supervisor children kept referenced so Python reaps them (no zombie, no ResourceWarning).
_CHILDREN: list[subprocess.Popen[bytes]] = []


# --------------------------------------------------------------------------- records


class LocalLaunch(BaseModel):
    """What the supervisor runs (launch.json), fixed at `up`."""

    name: str
    token: str
    """Unique per run; part of every node process's tag."""
    task_id: str
    """SKYPILOT_TASK_ID, the same for every attempt."""
    workdir: str
    setup: str | None = None
    run: str
    envs: dict[str, str] = Field(default_factory=dict)
    num_nodes: int
    procs_per_node: int
    master_port: int
    ckpt_uri: str
    max_restarts: int = 3
    retry_on_error: int = 0
    recovery_delay: float = 2.0
    chaos_preempt_after: float | None = None
    cpu_threads: int = 1
    storage_endpoint: str | None = None
    """AWS_ENDPOINT_URL / STORAGE_EMULATOR_HOST at launch, for `chaos storage-outage`."""


class NodeRecord(BaseModel):
    """One node in state.json."""

    node: int
    launcher_pid: int | None = None
    """The node's `bash run.sh` (its session id)."""
    pids: list[int] = Field(default_factory=list)
    """Every live process of the node (launcher, torchrun, workers), refreshed each second."""
    started_at: float | None = None
    exit_code: int | None = None
    """Negative: killed by that signal."""
    ended_at: float | None = None


class Event(BaseModel):
    """Something that happened to the run, with its time."""

    t: float
    kind: str
    message: str
    attempt: int = 0
    node: int | None = None
    data: dict[str, Any] = Field(default_factory=dict)


class LocalState(BaseModel):
    """state.json: the supervisor's view of the run (`status --json` exposes it)."""

    name: str
    token: str
    state: RunState = RunState.PENDING
    num_nodes: int
    procs_per_node: int
    master_port: int
    ckpt_uri: str
    task_id: str
    attempt: int = 0
    restarts: int = 0
    preemptions: int = 0
    errors_retried: int = 0
    supervisor_pid: int | None = None
    started_at: float | None = None
    ended_at: float | None = None
    detail: str = ""
    nodes: list[NodeRecord] = Field(default_factory=list)
    events: list[Event] = Field(default_factory=list)


def load_launch(folder: Path) -> LocalLaunch:
    return LocalLaunch.model_validate_json((folder / LAUNCH_FILE).read_text())


def load_state(folder: Path) -> LocalState:
    """The run's state.json; RunNotFoundError when the folder holds no local run."""
    path = folder / STATE_FILE
    if not path.is_file():
        raise RunNotFoundError(f"no local run in {folder}; start one with mncloud up --cloud local")
    return LocalState.model_validate_json(path.read_text())


def save_state(folder: Path, state: LocalState) -> None:
    write_atomic(folder / STATE_FILE, state.model_dump_json(indent=2))


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """Every complete JSON line of a file (a torn last line is ignored)."""
    if not path.is_file():
        return []
    out = []
    for line in path.read_text(errors="replace").splitlines():
        with contextlib.suppress(ValueError):
            out.append(json.loads(line))
    return out


def _append_jsonl(path: Path, record: dict[str, Any]) -> None:
    with open(path, "a") as f:  # one write of one line: appends do not interleave
        f.write(json.dumps(record) + "\n")


# --------------------------------------------------------------------------- processes


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as s:
        s.bind((LOCALHOST, 0))
        return int(s.getsockname()[1])


def port_is_free(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((LOCALHOST, port))
        except OSError:
            return False
    return True


def _proc_stat(pid: int) -> tuple[str, int] | None:
    """(state letter, ppid) of a process, or None when it is gone."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = raw[raw.rfind(")") + 2 :].split()
    return fields[0], int(fields[1])


def pid_alive(pid: int | None) -> bool:
    """True when `pid` runs (a zombie is dead: it only waits for its parent to reap it)."""
    if not pid:
        return False
    stat = _proc_stat(pid)
    return stat is not None and stat[0] not in ("Z", "X")


def _all_pids() -> Iterator[int]:
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            yield int(entry.name)


def node_tag(token: str, node: int) -> str:
    return f"{token}/{node}"


def tagged_pids(token: str, node: int | None = None) -> list[int]:
    """Live processes of one node of a run (or of all its nodes), found by their env tag."""
    key = f"{constants.LOCAL_NODE_TAG_ENV}=".encode()
    want = node_tag(token, node).encode() if node is not None else None
    prefix = f"{token}/".encode()
    me = os.getpid()
    found = []
    for pid in _all_pids():
        if pid == me:
            continue
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes()
        except OSError:
            continue
        for item in environ.split(b"\0"):
            if item.startswith(key):
                value = item[len(key) :]
                if value == want if want is not None else value.startswith(prefix):
                    found.append(pid)
                break
    return found


def kill_tagged(token: str, node: int | None = None, sig: int = signal.SIGKILL) -> list[int]:
    """Signal every process of a node (or of the run) until none is left; return their pids.

    Rescans after each round: a process forked between the scan and the kill is caught by
    the next one. Zombies carry no environment and are not counted.
    """
    hit: set[int] = set()
    for _ in range(100):
        pids = [p for p in tagged_pids(token, node) if pid_alive(p)]
        if not pids:
            break
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)
        hit.update(pids)
        if sig != signal.SIGKILL:
            break
        time.sleep(0.01)
    return sorted(hit)


def _become_subreaper() -> None:
    """Orphans of the nodes (workers whose torchrun died) become our children, so we reap them."""
    with contextlib.suppress(Exception):
        ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER


def _reap_orphans(keep: set[int]) -> None:
    """Reap zombie children we did not start ourselves (`keep`: pids Popen waits for)."""
    me = os.getpid()
    for pid in _all_pids():
        if pid in keep:
            continue
        stat = _proc_stat(pid)
        if stat is not None and stat[1] == me and stat[0] == "Z":
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, os.WNOHANG)


def _supervisor_alive(state: LocalState) -> bool:
    pid = state.supervisor_pid
    if not pid_alive(pid):
        return False
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    return b"mncloud.backends.local" in cmdline


def describe_exit(code: int) -> str:
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"was killed by {name}"
    if code == constants.PREEMPTED_EXIT_CODE:
        return f"stopped for a preemption notice (exit {code})"
    return f"exited with code {code}"


# --------------------------------------------------------------------------- supervisor


class Supervisor:
    """Runs the nodes of one run, relaunching them after a preemption (see module docstring)."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.launch = load_launch(folder)
        self.state = load_state(folder)
        self.stop = threading.Event()
        self._lock = threading.Lock()
        self._run_log = open(folder / RUN_LOG, "a", buffering=1)  # noqa: SIM115
        self._node_logs = {
            n: open(folder / f"node-{n}.log", "a", buffering=1)  # noqa: SIM115
            for n in range(self.launch.num_nodes)
        }
        self._chaos_lines = 0
        self._preempt_requests: list[dict[str, Any]] = []
        self._procs: dict[int, subprocess.Popen[bytes]] = {}
        self._pumps: list[threading.Thread] = []
        self._first_step_t: float | None = None
        # Run-record events go through a queue to one writer thread: a bucket write can stall
        # for seconds during a storage outage, and supervision must never wait for it.
        self._records: queue.Queue[dict[str, Any] | None] = queue.Queue()
        self._recorder = threading.Thread(
            target=self._write_records, name="mncloud-records", daemon=True
        )
        self._recorder.start()
        # Every node's cloud metadata (AWS, GCP, Azure): "no notice" until `chaos preempt
        # --notice` flips one; the node is killed at the notice's deadline if still running.
        from mncloud.backends.metadata import MetadataServer

        self._metadata = MetadataServer()
        self._notice_kills: list[tuple[float, int, int]] = []  # (deadline, node, attempt)

    # ------------------------------------------------------------------ plumbing
    def _save(self) -> None:
        save_state(self.folder, self.state)

    def _log(self, line: str, node: int | None = None) -> None:
        with self._lock:
            self._run_log.write(line + "\n")
            if node is not None:
                self._node_logs[node].write(line + "\n")

    def event(
        self, kind: str, message: str, node: int | None = None, t: float | None = None, **data: Any
    ) -> None:
        now, st_attempt = t or time.time(), self.state.attempt
        self.state.events.append(
            Event(t=now, kind=kind, message=message, attempt=st_attempt, node=node, data=data)
        )
        self.state.detail = message
        self._save()
        self._log(f"[mncloud {datetime.fromtimestamp(now):%H:%M:%S}] {message}")
        self._record(kind, message, node, now, st_attempt)

    def _record(self, kind: str, message: str, node: int | None, at: float, attempt: int) -> None:
        """Queue the run-record (`runs.py`) event for a supervisor event, if it maps to one."""
        mapped = _RECORD_KINDS.get(kind)
        if kind == "launch":
            prev = [e.kind for e in self.state.events[:-1] if e.kind in ("preempted", "error")]
            mapped = "launch" if attempt == 1 else (
                "recovery" if prev and prev[-1] == "preempted" else "restart")  # fmt: skip
        if mapped:
            self._records.put({"kind": mapped, "node": node, "detail": message, "at": at})

    def _write_records(self) -> None:
        from mncloud import runs

        while (item := self._records.get()) is not None:
            try:
                runs.append_event(
                    self.launch.name, item["kind"], node=item["node"], cloud="local",
                    instance_type=f"cpu:{self.launch.procs_per_node}", spot=False,
                    hourly_price=0.0, detail=item["detail"], at=item["at"],
                )  # fmt: skip
            except Exception as err:  # a record must never break supervision
                self._log(f"[mncloud] run record event not written: {err}")

    def _flush_records(self, timeout: float = 60.0) -> None:
        """Let the record writer finish what is queued (bounded: a bucket may be down)."""
        self._records.put(None)
        self._recorder.join(timeout)

    def _pump(self, node: int, stream: IO[bytes], label: str) -> None:
        for raw in iter(stream.readline, b""):
            line = raw.decode(errors="replace").rstrip("\r\n")
            match = _RANK_PREFIX.match(line)
            if match:
                self._log(f"[node {node} rank {match[1]}] {match[2]}", node)
            else:
                self._log(f"[node {node}{label}] {line}", node)
        stream.close()

    def _env(self, node: int, setup: bool) -> dict[str, str]:
        la = self.launch
        node_dir = self.folder / "nodes" / f"node-{node}"
        for sub in ("tmp", "staging", "torchrun"):
            (node_dir / sub).mkdir(parents=True, exist_ok=True)
        threads = str(la.cpu_threads)
        env = dict(os.environ)
        env.update(la.envs)
        ips = "\n".join([LOCALHOST] * la.num_nodes)
        env.update({
            constants.SKYPILOT_NODE_IPS: ips,
            constants.SKYPILOT_NODE_RANK: str(node),
            constants.SKYPILOT_NUM_NODES: str(la.num_nodes),
            constants.SKYPILOT_NUM_GPUS_PER_NODE: str(la.procs_per_node),
            constants.SKYPILOT_TASK_ID: la.task_id,
            constants.CKPT_URI_ENV: la.ckpt_uri,
            constants.CKPT_STAGING_ENV: str(node_dir / "staging"),
            constants.PROGRESS_FILE_ENV: str(self.folder / PROGRESS_FILE),
            constants.CPU_THREADS_ENV: threads,
            constants.CLOUD_ENV: "local",
            constants.METADATA_URL_ENV: self._metadata.url(node),
            constants.METADATA_PROTOCOL_ENV: "all",
            constants.METADATA_POLL_ENV: str(NOTICE_POLL_S),
            constants.LOCAL_NODE_TAG_ENV: node_tag(la.token, node),
            "OMP_NUM_THREADS": threads,
            "MKL_NUM_THREADS": threads,
            "TMPDIR": str(node_dir / "tmp"),
            "GLOO_SOCKET_IFNAME": "lo",
            "PYTHONUNBUFFERED": "1",
            "PATH": os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")]),
            # torchrun tees each worker's output with a rank prefix (the task stays untouched).
            "PET_TEE": "3",
            "PET_LOG_DIR": str(node_dir / "torchrun"),
            "TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE": "[rank${rank}]:",
        })  # fmt: skip
        # Local nodes can be preempted with a notice at any time: watch (unless --env says no).
        env.setdefault(constants.PREEMPTION_WATCH_ENV, "1")
        if setup:
            env["SKYPILOT_SETUP_NODE_IPS"] = ips
            env["SKYPILOT_SETUP_NODE_RANK"] = str(node)
        return env

    def _start(self, node: int, script: str, label: str) -> subprocess.Popen[bytes]:
        proc = subprocess.Popen(
            ["/bin/bash", str(self.folder / script)],
            cwd=self.launch.workdir,
            env=self._env(node, setup=script == "setup.sh"),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        assert proc.stdout is not None
        pump = threading.Thread(target=self._pump, args=(node, proc.stdout, label), daemon=True)
        pump.start()
        self._pumps.append(pump)
        return proc

    def _kill_all(self) -> None:
        kill_tagged(self.launch.token)
        for proc in self._procs.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=10)
        for pump in self._pumps:
            pump.join(timeout=5)
        self._pumps.clear()
        _reap_orphans(set())

    def _ingest_chaos(self) -> None:
        lines = read_jsonl(self.folder / CHAOS_FILE)
        for record in lines[self._chaos_lines :]:
            if record.get("action") == "preempt":
                self._preempt_requests.append(record)
            if record.get("action") == "notice":
                node, deadline = int(record["node"]), float(record["deadline"])
                self._metadata.announce(node, str(record["protocol"]), deadline)
                self._notice_kills.append((deadline, node, self.state.attempt))
            data = {k: v for k, v in record.items() if k not in ("t", "message", "node")}
            self.event(f"chaos-{record.get('action')}", str(record.get("message", "")),
                       node=record.get("node"), t=record.get("t"), **data)  # fmt: skip
        self._chaos_lines = len(lines)

    def _sleep(self, seconds: float) -> None:
        self.stop.wait(max(0.0, seconds))

    # ------------------------------------------------------------------ phases
    def main(self) -> int:
        """Run setup, then attempts until success, failure or `down`; return an exit code."""
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: self.stop.set())
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
        _become_subreaper()
        st = self.state
        st.supervisor_pid = os.getpid()
        self._metadata.start()
        st.started_at = time.time()
        st.state = RunState.STARTING
        st.nodes = [NodeRecord(node=n) for n in range(self.launch.num_nodes)]
        self._save()
        try:
            final = self._run()
        except Exception as err:  # anything unexpected: stop the nodes, say why
            final = RunState.FAILED
            self.event("failed", f"supervisor error: {type(err).__name__}: {err}")
        finally:
            self._kill_all()
            self._metadata.stop()
        st.state = final
        st.ended_at = time.time()
        for record in st.nodes:
            record.pids = []
        self.event(final.value.lower(), self._final_message(final))
        self._flush_records()
        for f in (self._run_log, *self._node_logs.values()):
            f.close()
        return 0 if final is RunState.SUCCEEDED else 1

    def _final_message(self, final: RunState) -> str:
        st = self.state
        tail = f"{st.restarts} restart(s), {st.preemptions} preemption(s)"
        if final is RunState.FAILED:
            return st.detail if st.detail.startswith(("failed", "supervisor")) else "failed"
        return {
            RunState.SUCCEEDED: f"succeeded after {tail}",
            RunState.CANCELLED: f"stopped by mncloud down after {tail}",
        }.get(final, tail)

    def _run(self) -> RunState:
        la, st = self.launch, self.state
        if la.setup:
            for node in range(la.num_nodes):
                self.event("setup", f"setup on node {node}", node=node)
                proc = self._procs[node] = self._start(node, "setup.sh", " setup")
                while proc.poll() is None:
                    if self.stop.wait(POLL_S):
                        return RunState.CANCELLED
                self._kill_all()
                if proc.returncode != 0:
                    st.detail = f"failed: setup on node {node} {describe_exit(proc.returncode)}"
                    return RunState.FAILED
        while True:
            outcome, message = self._attempt()
            if outcome == "succeeded":
                return RunState.SUCCEEDED
            if outcome == "stopped":
                return RunState.CANCELLED
            if st.restarts >= la.max_restarts:
                st.detail = f"failed: {message}; --max-restarts {la.max_restarts} reached"
                return RunState.FAILED
            if outcome == "preempted":
                st.preemptions += 1
            elif st.errors_retried >= la.retry_on_error:
                st.detail = (
                    f"failed: {message} (an error in your code; not retried: "
                    f"--retry-on-error {la.retry_on_error})"
                )
                return RunState.FAILED
            else:
                st.errors_retried += 1
            st.restarts += 1
            st.state = RunState.RECOVERING
            self.event(
                "recovering",
                f"relaunching all nodes in {la.recovery_delay:g}s "
                f"(restart {st.restarts}/{la.max_restarts})",
            )
            self._sleep(la.recovery_delay)
            if self.stop.is_set():
                return RunState.CANCELLED

    def _attempt(self) -> tuple[str, str]:
        """One launch of all nodes; returns (succeeded|preempted|error|stopped, message)."""
        la, st = self.launch, self.state
        st.attempt += 1
        started = time.time()
        self._metadata.clear()  # a relaunch gets fresh VMs
        self._procs = {}
        for node in range(la.num_nodes):
            proc = self._procs[node] = self._start(node, "run.sh", "")
            st.nodes[node] = NodeRecord(
                node=node, launcher_pid=proc.pid, pids=[proc.pid], started_at=time.time()
            )
        st.state = RunState.RUNNING
        self.event("launch", f"attempt {st.attempt}: {la.num_nodes} node(s) × "
                   f"{la.procs_per_node} process(es) started", pids=[p.pid for p in
                   self._procs.values()])  # fmt: skip
        chaos_pending = la.chaos_preempt_after is not None and st.attempt == 1
        last_scan = 0.0
        stopping_until: float | None = None  # nodes stopping for a notice: let the rest follow
        while True:
            if self.stop.wait(POLL_S):
                return "stopped", "stopped"
            self._ingest_chaos()
            now = time.time()
            if chaos_pending and self._chaos_due(started, now):
                chaos_pending = False
                preempt_node(self.folder, la.num_nodes - 1, by="--chaos-preempt-after")
            self._kill_at_deadlines(now)
            codes = {n: p.poll() for n, p in self._procs.items()}
            failed = {n: c for n, c in codes.items() if c not in (None, 0)}
            if failed and all(c == constants.PREEMPTED_EXIT_CODE for c in failed.values()):
                stopping_until = stopping_until or now + NOTICE_EXIT_GRACE_S
                if now < stopping_until and None in codes.values():
                    continue
            if failed or all(c == 0 for c in codes.values()):
                break
            if now - last_scan >= 1.0:
                last_scan = now
                self._refresh_pids()
                _reap_orphans({p.pid for p in self._procs.values()})
        self._ingest_chaos()  # a request written just before the kill we noticed
        for n, code in codes.items():
            if code is not None:
                st.nodes[n].exit_code, st.nodes[n].ended_at = code, time.time()
        if not failed:
            self._kill_all()
            return "succeeded", "all nodes exited 0"
        requested = {int(r["node"]) for r in self._preempt_requests if r["t"] >= started}
        vanished = {n for n, c in failed.items() if c < 0 or c == constants.PREEMPTED_EXIT_CODE}
        preempted = bool(vanished or requested)
        first = min(vanished or requested or set(failed))
        code = failed.get(first, codes.get(first))
        what = describe_exit(code) if code is not None else "was preempted"
        message = f"node {first} {what}" + (" (preempted)" if preempted else "")
        self._kill_all()  # first: no commit may land after we look at the bucket
        latest = self._latest_checkpoint()
        where = f"step {latest}" if latest is not None else "none"
        self.event("preempted" if preempted else "error",
                   f"{message}; newest complete checkpoint: {where}", node=first,
                   exit_codes={str(k): v for k, v in codes.items()},
                   latest_checkpoint=latest)  # fmt: skip
        return ("preempted" if preempted else "error"), message

    def _kill_at_deadlines(self, now: float) -> None:
        """A node told it would be preempted and still running at the deadline is killed."""
        for deadline, node, attempt in list(self._notice_kills):
            if deadline > now:
                continue
            self._notice_kills.remove((deadline, node, attempt))
            if attempt == self.state.attempt and self._procs[node].poll() is None:
                preempt_node(self.folder, node, by="the notice's deadline")

    def _latest_checkpoint(self) -> int | None:
        """The newest COMPLETE step in the bucket (None if none or unreachable)."""
        from mncloud.ckptstore import CheckpointStore

        with contextlib.suppress(Exception):
            good, _ = CheckpointStore(self.launch.ckpt_uri, retry_seconds=2).candidates()
            return good[0] if good else None
        return None

    def _chaos_due(self, started: float, now: float) -> bool:
        """`--chaos-preempt-after D`: D after the first step the script reports, else after
        launch (when no step is reported within D + CHAOS_NO_PROGRESS_S)."""
        delay = self.launch.chaos_preempt_after or 0.0
        if self._first_step_t is None:
            for record in read_jsonl(self.folder / PROGRESS_FILE):
                if "step" in record and "event" not in record and record["t"] >= started:
                    self._first_step_t = float(record["t"])
                    break
        if self._first_step_t is not None:
            return now >= self._first_step_t + delay
        return now >= started + delay + CHAOS_NO_PROGRESS_S

    def _refresh_pids(self) -> None:
        changed = False
        for record in self.state.nodes:
            pids = sorted(tagged_pids(self.launch.token, record.node))
            if pids != record.pids:
                record.pids, changed = pids, True
        if changed:
            self._save()


# --------------------------------------------------------------------------- chaos (core)


def _staging_steps(folder: Path, node: int) -> list[int]:
    """Steps whose checkpoint files a rank of `node` is writing or uploading right now."""
    found = []
    for path in (folder / "nodes" / f"node-{node}" / "staging").glob("rank_*/step_*"):
        with contextlib.suppress(ValueError):
            found.append(int(path.name.removeprefix("step_")))
    return found


def _wait_for_save(folder: Path, node: int, timeout: float) -> int:
    """Wait until a rank of `node` writes a checkpoint; return its step."""
    deadline = time.monotonic() + timeout
    while not (steps := _staging_steps(folder, node)):
        if time.monotonic() > deadline:
            raise BackendError(
                f"no checkpoint save started on node {node} within {timeout:g}s; "
                "preempt without --during-save"
            )
        state = load_state(folder)
        if state.state.is_final:
            raise BackendError(f"run {state.name} ended ({state.state.value}) before a save")
        time.sleep(0.002)
    return max(steps)


def preempt_node(
    folder: Path,
    node: int,
    *,
    by: str = "mncloud chaos",
    during_save: bool = False,
    save_timeout: float = 120.0,
) -> dict[str, Any]:
    """SIGKILL every process of `node`, like a spot VM vanishing; return the chaos record.

    With `during_save`, wait until a rank of that node is writing a checkpoint (its staging
    folder holds a step) and kill it then, leaving that step torn.
    """
    launch = load_launch(folder)
    step = _wait_for_save(folder, node, save_timeout) if during_save else None
    record: dict[str, Any] = {"t": time.time(), "action": "preempt", "node": node, "by": by}
    where = f" while it saved step {step}" if step is not None else ""
    record["message"] = f"{by}: preempting node {node}{where} (SIGKILL)"
    record["during_save_step"] = step
    _append_jsonl(folder / CHAOS_FILE, record)
    record["pids"] = kill_tagged(launch.token, node)
    return record


def notify_node(
    folder: Path,
    node: int,
    notice_s: float,
    *,
    protocol: str = "gcp",
    during_save: bool = False,
    save_timeout: float = 120.0,
) -> dict[str, Any]:
    """Announce a spot preemption of `node` in `notice_s` through its metadata (in `protocol`:
    aws, gcp or azure); the supervisor kills the node then if it is still running."""
    from mncloud.backends.metadata import PROTOCOLS

    if protocol not in PROTOCOLS:
        raise BackendError(f"--cloud-protocol {protocol}: use one of {', '.join(PROTOCOLS)}")
    step = _wait_for_save(folder, node, save_timeout) if during_save else None
    now = time.time()
    where = f" while it saved step {step}" if step is not None else ""
    record: dict[str, Any] = {
        "t": now, "action": "notice", "node": node, "protocol": protocol,
        "notice_s": notice_s, "deadline": now + notice_s, "during_save_step": step,
        "message": f"mncloud chaos: {protocol} preemption notice to node {node}{where}; "
                   f"it goes in {notice_s:g}s",
    }  # fmt: skip
    _append_jsonl(folder / CHAOS_FILE, record)
    return record


def wait_for_running(folder: Path, timeout: float = 600.0) -> LocalState:
    """Wait until the run's nodes are up (RUNNING) or the run ended; return its state."""
    deadline = time.monotonic() + timeout
    while True:
        state = load_state(folder)
        if state.state is RunState.RUNNING or state.state.is_final:
            return state
        if not _supervisor_alive(state) and state.supervisor_pid is not None:
            raise BackendError(f"the supervisor of {state.name} is gone; see {SUPERVISOR_LOG}")
        if time.monotonic() > deadline:
            raise BackendError(f"run {state.name} not RUNNING after {timeout:g}s ({state.detail})")
        time.sleep(0.05)


def _listener_pid(port: int) -> int | None:
    """The pid of the process listening on 127.0.0.1:`port` (from /proc/net/tcp)."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError):
            for line in Path(table).read_text().splitlines()[1:]:
                parts = line.split()
                if parts[3] == "0A" and int(parts[1].rsplit(":", 1)[1], 16) == port:
                    inodes.add(parts[9])
    for pid in _all_pids():
        with contextlib.suppress(OSError):
            for fd in os.scandir(f"/proc/{pid}/fd"):
                with contextlib.suppress(OSError):
                    link = os.readlink(fd.path)
                    if link.startswith("socket:[") and link[8:-1] in inodes:
                        return pid
    return None


def storage_outage(folder: Path, seconds: float) -> Iterator[str]:
    """Make the run's bucket unreachable for `seconds`; yields progress lines.

    `file://` buckets get the outage marker (every operation fails as if the server were
    down); an S3/GCS endpoint on this machine (AWS_ENDPOINT_URL / STORAGE_EMULATOR_HOST at
    `up`) is frozen with SIGSTOP and thawed with SIGCONT, so requests hang as on a network
    partition. A real cloud bucket cannot be taken down: BackendError.
    """
    from mncloud.storage import set_simulated_outage, split_uri

    launch = load_launch(folder)
    scheme = split_uri(launch.ckpt_uri)[0]
    chaos = folder / CHAOS_FILE

    def note(message: str, **data: Any) -> str:
        _append_jsonl(chaos, {"t": time.time(), "action": "storage-outage", "message": message,
                              **data})  # fmt: skip
        return message

    if scheme == "file":
        set_simulated_outage(launch.ckpt_uri, True)
        try:
            yield note(f"storage outage: {launch.ckpt_uri} unreachable for {seconds:g}s",
                       phase="start")  # fmt: skip
            time.sleep(seconds)
        finally:
            set_simulated_outage(launch.ckpt_uri, False)
        yield note(f"storage outage over: {launch.ckpt_uri} reachable again", phase="end")
        return
    endpoint = launch.storage_endpoint or ""
    match = re.match(r"^https?://(127\.0\.0\.1|localhost|\[::1\]):(\d+)", endpoint)
    if not match:
        raise BackendError(
            f"cannot take {launch.ckpt_uri} down: chaos storage-outage needs a file:// bucket "
            "or an S3/GCS server on this machine (AWS_ENDPOINT_URL=http://127.0.0.1:PORT)"
        )
    pid = _listener_pid(int(match[2]))
    if pid is None:
        raise BackendError(f"nothing listens on {endpoint}; is the storage server running?")
    os.kill(pid, signal.SIGSTOP)
    try:
        yield note(f"storage outage: server {endpoint} (pid {pid}) frozen for {seconds:g}s",
                   phase="start", pid=pid)  # fmt: skip
        time.sleep(seconds)
    finally:
        os.kill(pid, signal.SIGCONT)
    yield note(f"storage outage over: server {endpoint} answers again", phase="end", pid=pid)


# --------------------------------------------------------------------------- reports


class RecoveryFigures(BaseModel):
    """What a run's relaunches cost, from its events and rank 0's progress lines."""

    attempts: int
    restarts: int
    preemptions: int
    wall_s: float | None
    cold_start_s: float | None
    """From the first launch of the nodes to the first finished training step."""
    resume_s: list[float] = Field(default_factory=list)
    """Per recovery: from the preemption to the first finished step after it."""
    steps_lost: int = 0
    """Steps trained before a failure and trained again after it."""
    lost_per_recovery: list[int] = Field(default_factory=list)
    resumed_from: list[int | None] = Field(default_factory=list)
    steps_per_attempt: list[list[int]] = Field(default_factory=list)
    final: dict[str, Any] | None = None
    """The script's final.json, when it wrote one."""


def recovery_figures(folder: Path) -> RecoveryFigures:
    """Summarise a local run (live or finished) for the demo summary, tests and bench."""
    state = load_state(folder)
    launches = [e for e in state.events if e.kind == "launch"]
    failures = [e for e in state.events if e.kind in ("preempted", "error")]
    kills = [e for e in state.events if e.kind == "chaos-preempt"]
    progress = read_jsonl(folder / PROGRESS_FILE)
    bounds = [e.t for e in launches] + [float("inf")]
    steps: list[list[int]] = [[] for _ in launches]
    first_step_t: list[float | None] = [None for _ in launches]
    resumed: list[int | None] = [None for _ in launches]
    for rec in progress:
        k = next((i for i in range(len(launches)) if bounds[i] <= rec["t"] < bounds[i + 1]), None)
        if k is None:
            continue
        if rec.get("event") == "start":
            resumed[k] = int(rec.get("resumed_from") or 0)
        elif "step" in rec and "event" not in rec:
            steps[k].append(int(rec["step"]))
            if first_step_t[k] is None:
                first_step_t[k] = float(rec["t"])
    lost, resume_s = [], []
    for k in range(1, len(launches)):
        before = max(steps[k - 1], default=resumed[k - 1] or 0)
        if resumed[k] is not None:
            lost.append(max(0, before - resumed[k]))
        hit = [e.t for e in kills + failures if bounds[k - 1] <= e.t < bounds[k]]
        if hit and first_step_t[k] is not None:
            resume_s.append(round(first_step_t[k] - min(hit), 2))
    cold = first_step_t[0] - launches[0].t if launches and first_step_t[0] else None
    final = None
    with contextlib.suppress(Exception):
        final = read_final(state.ckpt_uri)
    return RecoveryFigures(
        attempts=len(launches),
        restarts=state.restarts,
        preemptions=state.preemptions,
        wall_s=(state.ended_at or time.time()) - state.started_at if state.started_at else None,
        cold_start_s=round(cold, 2) if cold is not None else None,
        resume_s=resume_s,
        steps_lost=sum(lost),
        lost_per_recovery=lost,
        resumed_from=resumed,
        steps_per_attempt=steps,
        final=final,
    )


def read_final(ckpt_uri: str) -> dict[str, Any] | None:
    """The script's final.json beside its checkpoints, or None."""
    from mncloud.storage import ObjectNotFoundError, join_key, open_bucket

    bucket, prefix = open_bucket(ckpt_uri, retry_seconds=5)
    try:
        return dict(json.loads(bucket.get_bytes(join_key(prefix, FINAL_FILE))))
    except ObjectNotFoundError:
        return None


# --------------------------------------------------------------------------- backend


def _start_supervisor(folder: Path) -> subprocess.Popen[bytes]:
    with open(folder / SUPERVISOR_LOG, "ab") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "mncloud.backends.local", "supervise", str(folder)],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # survives the terminal of `up`
        )
    _CHILDREN.append(proc)
    return proc


def _wait_for(check: Any, timeout: float, interval: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(interval)
    return bool(check())


def prepare_run(folder: Path, launch: LocalLaunch, task_yaml: str) -> None:
    """Write a fresh run folder: launch.json, the task and its scripts, a PENDING state."""
    for child in folder.iterdir() if folder.is_dir() else []:
        if child.name == BACKEND_FILE:
            continue
        if child.is_dir() and not child.is_symlink():
            shutil.rmtree(child)
        else:
            child.unlink()
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "task.yaml").write_text(task_yaml)
    (folder / "run.sh").write_text(launch.run)
    if launch.setup:
        (folder / "setup.sh").write_text(launch.setup)
    write_atomic(folder / LAUNCH_FILE, launch.model_dump_json(indent=2))
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
    """Start the supervisor of a prepared run folder; return its first state."""
    proc = _start_supervisor(folder)
    _wait_for(lambda: load_state(folder).supervisor_pid is not None or proc.poll() is not None, 30)
    state = load_state(folder)
    if state.supervisor_pid is None:
        log = (folder / SUPERVISOR_LOG).read_text(errors="replace").strip().splitlines()
        raise BackendError(f"the local supervisor did not start: {log[-1] if log else 'no output'}")
    return state


REFERENCE_DIR = "reference"


def start_reference(run_name: str) -> Path:
    """Start the same task once more, without chaos, in `<run folder>/reference/`.

    Same rendered run script, nodes, processes and thread count; its own port, task id and
    local checkpoint folder; no recovery. Its final.json is the uninterrupted reference.
    """
    folder = run_dir(run_name)
    launch = load_launch(folder)
    ref = folder / REFERENCE_DIR
    ref_launch = launch.model_copy(
        update={
            "name": f"{run_name}-reference",
            "token": uuid.uuid4().hex[:12],
            "task_id": f"{launch.task_id}-reference",
            "master_port": free_port(),
            "ckpt_uri": f"file://{ref / 'checkpoints'}",
            "chaos_preempt_after": None,
            "retry_on_error": 0,
            "max_restarts": 0,
            "setup": None,  # ran already for this run
        }
    )
    prepare_run(ref, ref_launch, (folder / "task.yaml").read_text())
    start_supervised(ref)
    return ref


def stop_folder(folder: Path) -> None:
    """Stop the supervisor and every node process of a run folder (used for references)."""
    with contextlib.suppress(RunNotFoundError):
        state = load_state(folder)
        if _supervisor_alive(state):
            with contextlib.suppress(ProcessLookupError):
                os.kill(state.supervisor_pid or 0, signal.SIGTERM)
            if not _wait_for(lambda: not _supervisor_alive(load_state(folder)), 30):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(state.supervisor_pid or 0, signal.SIGKILL)
        kill_tagged(state.token)
        state = load_state(folder)
        if not state.state.is_final:
            state.state, state.ended_at = RunState.CANCELLED, time.time()
            state.detail = "stopped by mncloud down"
            save_state(folder, state)


class LocalBackend:
    """Runs the rendered task on N local nodes under a supervisor process."""

    name = "local"

    def launch(self, request: LaunchRequest) -> RunStatus:
        spec, config, opts = request.spec, request.task.config, request.options
        folder = run_dir(spec.name)
        with contextlib.suppress(RunNotFoundError):
            old = load_state(folder)
            if not old.state.is_final and _supervisor_alive(old):
                raise BackendError(
                    f"run {spec.name!r} is still {old.state.value}; stop it with "
                    f"`mncloud down {spec.name}` or pick another --name"
                )
        if shutil.which("torchrun", path=str(Path(sys.executable).parent)) is None and (
            shutil.which("torchrun") is None
        ):
            raise BackendError("torchrun not found: pip install 'mncloud[train]' (torch)")
        if not port_is_free(spec.master_port):
            raise BackendError(
                f"port {spec.master_port} on 127.0.0.1 is in use; pass --master-port with a "
                "free port (another run may hold it)"
            )
        missing = [k for k in config.get("secrets") or {} if k not in os.environ]
        if missing:
            raise BackendError(f"--secret {missing[0]} is not set in your environment; export it")
        envs = {str(k): str(v) for k, v in (config.get("envs") or {}).items()}
        nodes = int(config.get("num_nodes", spec.nodes))
        procs = spec.procs_per_node
        launch = LocalLaunch(
            name=spec.name,
            token=uuid.uuid4().hex[:12],
            task_id=f"sky-{datetime.now():%Y-%m-%d-%H-%M-%S-%f}_{spec.name}_1",
            workdir=str(config.get("workdir") or spec.workdir),
            setup=config.get("setup"),
            run=str(config["run"]),
            envs=envs,
            num_nodes=nodes,
            procs_per_node=procs,
            master_port=spec.master_port,
            ckpt_uri=envs.get(constants.CKPT_URI_ENV) or f"file://{folder / 'checkpoints'}",
            max_restarts=spec.max_restarts,
            retry_on_error=int(opts.get("retry_on_error") or 0),
            recovery_delay=float(opts.get("recovery_delay") or 0.0),
            chaos_preempt_after=opts.get("chaos_preempt_after"),
            cpu_threads=max(1, (os.cpu_count() or 1) // (nodes * procs)),
            storage_endpoint=os.environ.get("AWS_ENDPOINT_URL")
            or os.environ.get("STORAGE_EMULATOR_HOST"),
        )
        if request.dryrun:
            return RunStatus(
                name=spec.name, backend=self.name, state=RunState.PENDING, nodes=nodes,
                cloud="local", instance_type=f"cpu:{procs}", hourly_total=0.0,
                ckpt_uri=launch.ckpt_uri,
                detail=f"dry run: would start {nodes} local node(s) × {procs} process(es)",
            )  # fmt: skip
        prepare_run(folder, launch, request.task.yaml_text)
        start_supervised(folder)
        return self.status(spec.name)

    def status(self, run_name: str) -> RunStatus:
        folder = run_dir(run_name)
        state = load_state(folder)
        run_state, detail = state.state, state.detail
        if not run_state.is_final and state.supervisor_pid and not _supervisor_alive(state):
            # Re-read: the supervisor may have written its final state just before exiting.
            state = load_state(folder)
            run_state, detail = state.state, state.detail
            if not run_state.is_final:
                run_state = RunState.FAILED
                detail = (
                    f"the supervisor stopped unexpectedly (see {folder / SUPERVISOR_LOG}); "
                    f"`mncloud down {run_name}` cleans up"
                )
        return RunStatus(
            name=run_name,
            backend=self.name,
            state=run_state,
            nodes=state.num_nodes,
            cloud="local",
            instance_type=f"cpu:{state.procs_per_node}",
            spot=None,
            restarts=state.restarts,
            preemptions=state.preemptions,
            started_at=state.started_at,
            ended_at=state.ended_at,
            hourly_total=0.0,
            ckpt_uri=state.ckpt_uri,
            detail=detail,
        )

    def logs(self, run_name: str, node: int | None = None, follow: bool = False) -> Iterator[str]:
        folder = run_dir(run_name)
        state = load_state(folder)
        if node is not None and not 0 <= node < state.num_nodes:
            raise BackendError(f"--node {node}: run {run_name} has nodes 0..{state.num_nodes - 1}")
        path = folder / (RUN_LOG if node is None else f"node-{node}.log")
        yield from tail_lines(path, follow=follow, done=lambda: self._ended(folder))

    @staticmethod
    def _ended(folder: Path) -> bool:
        state = load_state(folder)
        return state.state.is_final or not _supervisor_alive(state)

    def down(self, run_name: str) -> RunStatus:
        folder = run_dir(run_name)
        load_state(folder)  # RunNotFoundError for an unknown run
        stop_folder(folder / REFERENCE_DIR)
        stop_folder(folder)
        return self.status(run_name)


def tail_lines(path: Path, *, follow: bool, done: Any, poll: float = 0.2) -> Iterator[str]:
    """Lines of a growing file; with `follow`, until `done()` and the file stops growing."""
    while follow and not path.exists() and not done():
        time.sleep(poll)
    if not path.exists():
        return
    with open(path, errors="replace") as f:
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


def main(argv: list[str]) -> int:
    """`python -m mncloud.backends.local supervise RUN_FOLDER`."""
    if len(argv) != 2 or argv[0] != "supervise":
        print("usage: python -m mncloud.backends.local supervise RUN_FOLDER", file=sys.stderr)
        return 2
    return Supervisor(Path(argv[1])).main()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
