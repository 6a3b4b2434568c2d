"""Where the nodes of a cloud job group meet for the preflight (`--recovery node` on a cloud).

Each node of a SkyPilot job group is a single-node job of its own (`SKYPILOT_NUM_NODES=1`,
`SKYPILOT_NODE_IPS` its own private address, `SKYPILOT_NODE_RANK=0`): no node knows where the
others are. So node 0 (`MNCLOUD_REPLICA_ID=0`) publishes its address and the rendezvous port
beside the checkpoints (`PREFLIGHT.json`, as the lighthouse publishes its own), the other nodes
read it, and the gang check and the all-reduce bandwidth test run over it, one rank per node,
exactly as inside one cluster. Node 0 then writes the gang's verdict into the same note:

    node 0 up      PREFLIGHT.json {launch: r-1, address: 10.0.3.7, port: 29500, verdict: open}
    node 1 up      reads it → gang check + all-reduce with 10.0.3.7:29500
    node 0         verdict passed (or failed, with the one-line problems) → training
    node 1 again   (SkyPilot recovered its task alone) verdict passed → checks itself alone
    any node again verdict failed → the same lines, exit 78: a floor never passes on a retry

A note of another launch (`MNCLOUD_RUN_ID`, else SkyPilot's `SKYPILOT_MANAGED_JOB_ID`) is not
used. The nodes reach node 0's private address because SkyPilot puts the whole group in one
cloud and region, where its VMs admit each other's traffic (see `render/jobgroup.py`). The note
holds an address, a port and one-line verdicts: no credential.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

from pydantic import BaseModel

from mncloud import constants
from mncloud.storage.checkpoints import CheckpointStore

NOTE = "PREFLIGHT.json"
MEET_TIMEOUT_S = 900.0
"""How long node 0 waits for the others, and they for its note: the tasks of a group are
provisioned one by one and start `run` as each VM is ready, minutes apart."""
POLL_S = 2.0
MANAGED_JOB_ID_ENV = "SKYPILOT_MANAGED_JOB_ID"
"""SkyPilot's managed-job id, the same on every task of a group and across their recoveries
(`sky/jobs/controller.py`)."""


class Meeting(BaseModel):
    """One launch's meeting point and, once the gang met, its verdict."""

    launch: str
    address: str
    port: int
    nodes: int
    at: float
    verdict: Literal["open", "passed", "failed"] = "open"
    problems: list[str] = []


@dataclass
class Place:
    """What this node's preflight does: meet `nodes` nodes at master:port (1: check alone),
    or repeat an earlier failed verdict of its launch (`refused`)."""

    rank: int
    nodes: int
    master: str
    port: int
    refused: list[str] = field(default_factory=list)
    note: str = ""


def launch_id(environ: dict[str, str] | None = None) -> str | None:
    """This launch's identity: mncloud's run id, else SkyPilot's managed-job id."""
    env = os.environ if environ is None else environ
    run_id = env.get(constants.RUN_ID_ENV)
    job_id = env.get(MANAGED_JOB_ID_ENV)
    return run_id or (f"managed-job-{job_id}" if job_id else None)


def _read(store: CheckpointStore, launch: str, patient: bool = False) -> Meeting | None:
    """This launch's meeting, if any. `patient`: an unreachable bucket counts as none (the
    caller's deadline bounds the wait); otherwise its error is raised (after the store's own
    retries): node 0 must never take a bucket hiccup for "no gang met yet"."""
    try:
        note = store.get_note(NOTE, Meeting)
    except Exception:
        if not patient:
            raise
        return None
    return note if note is not None and note.launch == launch else None


def join(
    store: CheckpointStore,
    launch: str,
    rank: int,
    nodes: int,
    address: str,
    port: int,
    timeout: float = MEET_TIMEOUT_S,
    sleep: Callable[[float], None] = time.sleep,
) -> Place:
    """Node 0 opens the meeting (unless its launch's gang already met); the others wait for it.

    Raises TimeoutError (one line) when a node finds no meeting of its launch within `timeout`.
    """
    alone = Place(rank, 1, address, port, note="the gang met already: this node checks itself")
    if rank == 0:
        earlier = _read(store, launch)
        if earlier is not None and earlier.verdict == "failed":
            return Place(rank, nodes, address, port, refused=earlier.problems)
        if earlier is not None and earlier.verdict == "passed":
            return alone
        # None, or open (node 0 itself restarted mid-meeting): open it (again) here.
        store.put_note(NOTE, Meeting(launch=launch, address=address, port=port, nodes=nodes,
                                     at=time.time()))  # fmt: skip
        return Place(rank, nodes, address, port)
    deadline = time.monotonic() + timeout
    while (meeting := _read(store, launch, patient=True)) is None:
        if time.monotonic() >= deadline:
            raise TimeoutError(
                f"preflight failed on node {rank}: node 0 published no meeting point under "
                f"{store.uri} within {timeout:g}s (see node 0's logs: `mncloud logs RUN`)"
            )
        sleep(POLL_S)
    if meeting.verdict == "failed":
        return Place(rank, nodes, meeting.address, meeting.port, refused=meeting.problems)
    if meeting.verdict == "passed":
        return alone
    return Place(rank, meeting.nodes, meeting.address, meeting.port)


def close(store: CheckpointStore, launch: str, problems: list[str]) -> None:
    """Node 0: the gang's verdict into its launch's note (replacements and retries read it)."""
    meeting = _read(store, launch)
    if meeting is None:
        return
    verdict: Literal["passed", "failed"] = "failed" if problems else "passed"
    store.put_note(NOTE, meeting.model_copy(update={"verdict": verdict, "problems": problems}))
