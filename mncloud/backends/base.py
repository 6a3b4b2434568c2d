"""One interface, two engines: the CLI drives a `Backend` and never knows which one.

`local` runs the rendered task on this machine (N simulated nodes); `skypilot` hands it to
SkyPilot (a cluster for on-demand, a managed job for spot). Every run, whichever engine, has
a folder `~/.mncloud/runs/<name>/` (`$MNCLOUD_HOME/runs/<name>`) holding `backend.json`, so
`status`, `logs` and `down` find the engine of a run by its name.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from pydantic import BaseModel, Field, computed_field

from mncloud.catalog import mncloud_home
from mncloud.errors import BackendError, MncloudError, RunNotFoundError

if TYPE_CHECKING:
    from collections.abc import Iterator

    from mncloud.plan import Plan
    from mncloud.render import RenderedTask
    from mncloud.spec import JobSpec

BACKEND_FILE = "backend.json"


class RunState(str, Enum):
    """Life cycle of a run, the same words for every backend."""

    PENDING = "PENDING"
    STARTING = "STARTING"
    RUNNING = "RUNNING"
    RECOVERING = "RECOVERING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"

    @property
    def is_final(self) -> bool:
        return self in (RunState.SUCCEEDED, RunState.FAILED, RunState.CANCELLED)


class RunStatus(BaseModel):
    """What `mncloud status` shows for one run."""

    name: str
    backend: str
    state: RunState
    nodes: int
    cloud: str | None = None
    region: str | None = None
    instance_type: str | None = None
    spot: bool | None = None
    restarts: int = 0
    """Relaunches of the whole job (preemptions + retried errors)."""
    preemptions: int = 0
    started_at: float | None = None
    ended_at: float | None = None
    hourly_total: float | None = None
    """USD per hour for all nodes, when known."""
    ckpt_uri: str | None = None
    ckpt_step: int | None = None
    """Newest complete checkpoint step in the bucket (filled by `run_status`)."""
    detail: str = ""
    """One line: the newest event or the reason of a failure."""
    step_times: dict[int, float] = Field(default_factory=dict)
    """Mean seconds per step by global rank, as the ranks last published them (`runs`)."""
    stragglers: list[int] = Field(default_factory=list)
    """Ranks at least `runs.STRAGGLER_FACTOR` × slower than the median (filled by `run_status`)."""

    @computed_field  # type: ignore[prop-decorator]
    @property
    def cost_so_far(self) -> float | None:
        if self.hourly_total is None or self.started_at is None:
            return None
        end = self.ended_at or time.time()
        return self.hourly_total * max(0.0, end - self.started_at) / 3600.0


@dataclass
class LaunchRequest:
    """Everything `up` hands a backend: the request, its plan and the rendered task."""

    spec: JobSpec
    task: RenderedTask
    plan: Plan | None = None
    detach: bool = False
    dryrun: bool = False
    options: dict[str, Any] = field(default_factory=dict)
    """Backend-specific options (local: recovery_delay, retry_on_error, chaos_preempt_after)."""


@runtime_checkable
class Backend(Protocol):
    """The engine behind `up`, `status`, `logs` and `down`."""

    name: str

    def launch(self, request: LaunchRequest) -> RunStatus:
        """Start the run (or, with `dryrun`, check it); return its status."""
        ...

    def status(self, run_name: str) -> RunStatus:
        """The current status of one run; RunNotFoundError if unknown."""
        ...

    def logs(self, run_name: str, node: int | None = None, follow: bool = False) -> Iterator[str]:
        """Lines of output, each prefixed with its node (and rank where known)."""
        ...

    def down(self, run_name: str) -> RunStatus:
        """Stop the run and release what it holds; idempotent."""
        ...


def runs_root() -> Path:
    """The folder holding one sub-folder per run."""
    return mncloud_home() / "runs"


def run_dir(run_name: str) -> Path:
    return runs_root() / run_name


def record_backend(run_name: str, backend: str, extra: dict[str, Any] | None = None) -> Path:
    """Remember which backend owns a run (written by `up` before launching)."""
    folder = run_dir(run_name)
    folder.mkdir(parents=True, exist_ok=True)
    data = {"backend": backend, "name": run_name, "created_at": time.time(), **(extra or {})}
    (folder / BACKEND_FILE).write_text(json.dumps(data, indent=2))
    return folder


def backend_name_of(run_name: str) -> str:
    """Which backend owns `run_name`; RunNotFoundError with the known names otherwise."""
    path = run_dir(run_name) / BACKEND_FILE
    if not path.is_file():
        known = ", ".join(known_runs()) or "none yet"
        raise RunNotFoundError(f"no run named {run_name!r} (known runs: {known})")
    return str(json.loads(path.read_text())["backend"])


def known_runs() -> list[str]:
    """Names of every run this machine launched, oldest first."""
    root = runs_root()
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if (p / BACKEND_FILE).is_file()]
    return [p.name for p in sorted(found, key=lambda p: (p / BACKEND_FILE).stat().st_mtime)]


def get_backend(name: str) -> Backend:
    """The backend called `name` (`local` or `skypilot`), imported only when asked for."""
    if name == "local":
        from mncloud.backends.local import LocalBackend

        return LocalBackend()
    if name == "skypilot":
        from mncloud.backends.skypilot import SkyPilotBackend

        return SkyPilotBackend()
    raise BackendError(f"unknown backend {name!r}; use local or skypilot")


def backend_for_run(run_name: str) -> Backend:
    return get_backend(backend_name_of(run_name))


#: How long `status` keeps trying a bucket before it reports it unreadable.
CKPT_LOOKUP_SECONDS = 5.0


def newest_checkpoint_step(uri: str) -> int | None:
    """The newest complete, verified checkpoint step under `uri`, or None."""
    from mncloud.ckptstore import CheckpointStore

    good, _skipped = CheckpointStore(uri, retry_seconds=CKPT_LOOKUP_SECONDS).candidates()
    return good[0] if good else None


def run_status(run_name: str) -> RunStatus:
    """A run's status from its backend, with the newest checkpoint read from its bucket and
    the straggling ranks from its newest run record (none without a record)."""
    status = backend_for_run(run_name).status(run_name)
    if status.ckpt_uri and status.ckpt_step is None:
        try:
            status.ckpt_step = newest_checkpoint_step(status.ckpt_uri)
        except MncloudError as err:
            note = f"checkpoints unreadable: {' '.join(str(err).split())[:120]}"
            status.detail = f"{note}; {status.detail}" if status.detail else note
    _add_stragglers(status)
    return status


def _add_stragglers(status: RunStatus) -> None:
    from mncloud import runs

    try:
        record = runs.load_current(status.name)
    except MncloudError:
        return
    status.step_times = runs.step_times(record, ckpt_uri=status.ckpt_uri)
    status.stragglers = runs.straggler_ranks(status.step_times)
    note = runs.straggler_note(status.step_times, status.stragglers)
    if note:
        status.detail = f"{note}; {status.detail}" if status.detail else note
