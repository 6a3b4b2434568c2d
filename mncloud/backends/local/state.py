"""The files of a local run folder and the pydantic models stored in them.

`$MNCLOUD_HOME/runs/<name>/` holds `launch.json` (what to run, fixed at `up`), `state.json`
(written only by the supervisor, atomically), `chaos.jsonl` (requests from `mncloud chaos`,
appended), `run.log`, `node-N.log`, `supervisor.log`, `lighthouse.log` (node recovery),
`task.yaml`, `setup.sh`, `run.sh`, `hosts.json` (a `--cluster` run's warm hosts) and
`nodes/node-N/`. What the script reports (steps, metrics, its start and end) is not here: its
ranks write it, as on a cloud, to the run's telemetry segments in its bucket (`series_uri`; a
run without `--bucket` has a `file://` one).
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from mncloud import constants, layout
from mncloud.backends.base import RunState
from mncloud.errors import RunNotFoundError
from mncloud.storage import write_atomic
from mncloud.telemetry.seriestail import SeriesTail

LAUNCH_FILE = "launch.json"
STATE_FILE = "state.json"
CHAOS_FILE = "chaos.jsonl"
RUN_LOG = "run.log"
LOG_MARKS = "run.log.marks"
"""Lines `{"t": time, "offset": bytes}`: run.log's size at that time, at most one a second
(`mncloud logs --since` starts reading there)."""
SUPERVISOR_LOG = "supervisor.log"
LIGHTHOUSE_LOG = "lighthouse.log"
TASK_FILE = "task.yaml"
REFERENCE_DIR = "reference"
"""A run's uninterrupted twin (`mncloud up` compares final weights with it)."""


def node_log(node: int) -> str:
    return f"node-{node}.log"


def node_dir(folder: Path, node: int) -> Path:
    """A node's own folder: its TMPDIR, checkpoint staging and torchrun logs."""
    return folder / "nodes" / f"node-{node}"


def node_ckpt_dir(folder: Path, node: int) -> Path:
    """A node's `--ckpt-dir` folder (its MNCLOUD_CKPT_DIR), lost when the node is preempted."""
    return node_dir(folder, node) / layout.CKPT_DIR_NAME


class RunShape(BaseModel):
    """What launch.json and state.json both say of a run: who it is and its shape."""

    name: str
    token: str
    """Unique per run; part of every node process's tag."""
    task_id: str
    """SKYPILOT_TASK_ID, the same for every attempt."""
    num_nodes: int
    procs_per_node: int
    master_port: int
    ckpt_uri: str


class LocalLaunch(RunShape):
    """What the supervisor runs (launch.json), fixed at `up`."""

    run_id: str | None = None
    """The run record's id, when `up` wrote one."""
    workdir: str
    setup: str | None = None
    run: str
    envs: dict[str, str] = Field(default_factory=dict)
    max_restarts: int = 3
    recovery_delay: float = 2.0
    chaos_preempt_after: float | None = None
    preflight_always: bool = False
    """`--preflight-always`: the bandwidth test at every launch, never a reused figure."""
    cpu_threads: int = 1
    storage_endpoint: str | None = None
    """AWS_ENDPOINT_URL / STORAGE_EMULATOR_HOST at launch, for `chaos storage-outage`."""
    spot: bool = False
    """The task's market (a deadline rehearsal launches "spot" and "on-demand" local nodes)."""
    hourly_price: float = 0.0
    """USD per hour for the whole run in the run record's ledger (`--spot-price` etc.)."""
    recovery: str = "gang"
    """`node`: a lost node is replaced alone (`replacing.py`); `gang`: all are relaunched."""
    min_replicas: int = 1
    """Node recovery: with fewer nodes alive, the whole gang is relaunched instead."""
    idle_s: float | None = None
    """`up --cluster`: warm node hosts (`warm.py`) that end after this long without a job;
    None: cold workers only."""


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
    status: str = "starting"
    """starting, running, replacing (node recovery: being provisioned), healing (started,
    taking the state from a live peer), finished or stopped."""
    replacements: int = 0
    """Node recovery: how often this node was replaced alone."""


class Event(BaseModel):
    """Something that happened to the run, with its time."""

    t: float
    kind: str
    message: str
    attempt: int = 0
    node: int | None = None
    data: dict[str, Any] = Field(default_factory=dict)


class LocalState(RunShape):
    """state.json: the supervisor's view of the run (`status --json` exposes it)."""

    state: RunState = RunState.PENDING
    attempt: int = 0
    restarts: int = 0
    preemptions: int = 0
    outages: int = 0
    """Relaunches after a storage outage (`STORAGE_OUTAGE_EXIT_CODE`): not `errors_retried`."""
    errors_retried: int = 0
    refused: bool = False
    """The script refused its input (`REFUSED_EXIT_CODE`): failed, not retried."""
    supervisor_pid: int | None = None
    started_at: float | None = None
    ended_at: float | None = None
    detail: str = ""
    nodes: list[NodeRecord] = Field(default_factory=list)
    events: list[Event] = Field(default_factory=list)
    quorum: list[int] = Field(default_factory=list)
    """Node recovery: the nodes in the replicas' newest quorum."""


def load_launch(folder: Path) -> LocalLaunch:
    return LocalLaunch.model_validate_json((folder / LAUNCH_FILE).read_text())


def save_launch(folder: Path, launch: LocalLaunch) -> None:
    write_atomic(folder / LAUNCH_FILE, launch.model_dump_json(indent=2))


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


def append_jsonl(path: Path, record: dict[str, Any]) -> None:
    with open(path, "a") as f:  # one write of one line: appends do not interleave
        f.write(json.dumps(record) + "\n")


def run_id_of(launch: LocalLaunch) -> str:
    """The run id the run's ranks write their telemetry under (`MNCLOUD_RUN_ID`): the task's
    (its record's), else one made of the run's token (a run started without a record)."""
    return launch.envs.get(constants.RUN_ID_ENV) or launch.run_id or f"local-{launch.token}"


def series_uri(folder: Path) -> str | None:
    """Where the run's ranks write their telemetry segments (`telemetry.series`), or None for a
    folder without a readable launch.json."""
    try:
        launch = load_launch(folder)
    except (OSError, ValueError):
        return None
    return layout.series_uri(launch.ckpt_uri, run_id_of(launch))


_newest: dict[str, tuple[SeriesTail, list[int]]] = {}


def last_step(folder: Path) -> int | None:
    """The newest step rank 0 reported (of node 0), read incrementally: a call fetches only
    the segments written since the last one (`telemetry.seriestail`)."""
    uri = series_uri(folder)
    if uri is None:
        return None
    tail, newest = _newest.setdefault(uri, (SeriesTail(uri), []))
    steps = [r.step for r in tail.read().steps if r.rank == 0 and not r.node]
    newest[:] = steps[-1:] or newest
    return newest[0] if newest else None
