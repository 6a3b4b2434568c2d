"""The run record and its parts: what ran (lineage), how it was launched, what happened to it.

Pure data (pydantic); the store (`store.py`) writes and reads it, the ledger (`ledger.py`)
prices its events.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

from mncloud import __version__, layout
from mncloud.errors import MncloudError

SCHEMA_VERSION = 1

EventKind = Literal[
    "launch", "preemption", "recovery", "restart", "checkpoint", "finish", "failure",
    "node-lost", "node-joined", "node-healed", "export", "running", "waiting",
]  # fmt: skip
#: Events that start a stretch of billed time, and those that end one (see `ledger.py`). Under
#: node recovery a lost node and its replacement's start change the price (N−1 nodes, then N).
#: `running` / `waiting`: the job's VMs started (or recovered) / stopped running it, at the
#: times its scheduler reports (SkyPilot's queue: `ledger.catch_up`).
OPENS_SEGMENT = ("launch", "recovery", "restart", "node-lost", "node-joined", "running")
#: Events that count as a spot preemption: of the whole gang, or of one node (node recovery).
PREEMPTIONS = ("preemption", "node-lost")
CLOSES_SEGMENT = ("preemption", "failure", "finish", "waiting")


class RecordError(MncloudError):
    """A run record is missing, unreadable or cannot serve the request."""


class Event(BaseModel):
    """One thing that happened to a run, with where it ran and at what price."""

    kind: EventKind
    time: float
    """Seconds since the epoch."""
    node: int | None = None
    """The node concerned (a preemption's node), if one."""
    cloud: str | None = None
    region: str | None = None
    instance_type: str | None = None
    spot: bool | None = None
    hourly_price: float | None = None
    """USD per hour for the whole job (all nodes) from this event on."""
    step: int | None = None
    """Training step (checkpoint events)."""
    detail: str = ""


class UntrackedFile(BaseModel):
    """A file git does not track, so the diff does not carry it."""

    path: str
    """Relative to the repository root."""
    size: int
    sha256: str | None = None
    """None above `lineage.MAX_HASHED_FILE`."""


class GitInfo(BaseModel):
    """The code a run was launched from."""

    root: str
    """Repository root on the launching machine."""
    commit: str | None
    """HEAD, or None in a repository without commits."""
    branch: str | None = None
    remote: str | None = None
    """`origin`'s URL, credentials removed."""
    diff_sha256: str | None = None
    """sha256 of `git diff HEAD --binary` (None when the tree is clean)."""
    diff_bytes: int = 0
    diff_redacted: bool = False
    """The stored diff had secrets scrubbed out; it cannot be re-applied faithfully."""
    untracked: list[UntrackedFile] = Field(default_factory=list)
    workdir: str = "."
    """The spec's workdir relative to `root`."""

    @property
    def dirty(self) -> bool:
        return self.diff_sha256 is not None or bool(self.untracked)


class RunRecord(BaseModel):
    """Everything needed to reproduce a run and account for its cost."""

    schema_version: int = SCHEMA_VERSION
    run_id: str
    name: str
    user: str
    host: str
    created_at: float
    mncloud_version: str = __version__
    python: str = ""
    backend: str
    nodes: int = 1
    git: GitInfo | None = None
    spec: dict[str, Any]
    """The JobSpec as JSON (`JobSpec.model_validate` reads it back)."""
    launch_options: dict[str, Any] = Field(default_factory=dict)
    """The LaunchOptions as JSON: how the spec was planned and run (empty in old records)."""
    task_yaml: str
    plan: dict[str, Any] | None = None
    packages: dict[str, str] = Field(default_factory=dict)
    image: str | None = None
    labels: dict[str, str] = Field(default_factory=dict)
    bucket_uri: str | None = None
    """Where the bucket copy lives (`layout.record_uri`), or None."""
    events: list[Event] = Field(default_factory=list)
    step_times: dict[int, float] = Field(default_factory=dict)
    """Newest mean seconds per step, by global rank (from `telemetry.step_times`)."""
    bandwidth: dict[str, Any] | None = None
    """The preflight's all-reduce bus bandwidth test, as `status` first read it."""

    @property
    def finished(self) -> bool:
        """The last event ended the run (finish, or a failure not followed by a restart); an
        export (`up --export-on-finish`, recorded from the run's node) changes nothing."""
        last = next((e for e in reversed(self.events) if e.kind != "export"), None)
        return last is not None and last.kind in ("finish", "failure")

    @property
    def estimate(self) -> float | None:
        """The plan's expected cost for the whole job, if planned."""
        choice = (self.plan or {}).get("choice") or {}
        value = choice.get("expected_cost")
        return float(value) if value is not None else None

    @property
    def ckpt_uri(self) -> str | None:
        """The run's checkpoint prefix `<bucket>/<name>` (`layout.ckpt_uri`), or None."""
        bucket = self.spec.get("bucket")
        if not bucket:
            return None
        from mncloud.spec import BucketURL

        return layout.ckpt_uri(BucketURL.model_validate(bucket), self.name)
