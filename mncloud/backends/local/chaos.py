"""Break a local run on purpose, as a cloud would: preempt a node, warn it first, or take
its bucket away. `mncloud chaos` and the supervisor's `--chaos-preempt-after` call these.

A preemption *with notice*: the supervisor runs one cloud metadata server for the run
(`metadata.py`, 127.0.0.1, a free port) and points every node at its own part of it
(`MNCLOUD_METADATA_URL=http://127.0.0.1:PORT/node/N`, `MNCLOUD_METADATA_PROTOCOL=all`: a local
node watches the AWS, GCP and Azure protocols at once, polled every 0.5 s) with
`MNCLOUD_PREEMPTION_WATCH=1` (unless `--env` sets it). `chaos preempt demo --node 1 --notice
30s --cloud-protocol gcp` appends the request to chaos.jsonl; the supervisor flips node 1's
GCP `instance/preempted` to TRUE, and:

    t=0     node 1's watcher sees the notice; at the next step all 4 ranks agree (all-reduce)
            and save the same step, then exit 115 (`PREEMPTED_EXIT_CODE`)
    t=2     node 0 exits 115 first: the supervisor gives the other nodes up to 10 s to stop
            the same way, then counts one preemption and relaunches (resume: that step)
    t=30    the deadline: a node still running then is SIGKILLed (a notice the script ignored)
"""

from __future__ import annotations

import contextlib
import json
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil

from mncloud.backends.local.ckptdir import lose_disk, saving_path
from mncloud.backends.local.processes import kill_tagged, listener_pid
from mncloud.backends.local.state import (
    CHAOS_FILE,
    append_jsonl,
    load_launch,
    load_state,
    node_dir,
)
from mncloud.errors import BackendError

_LOCAL_ENDPOINT = re.compile(r"^https?://(127\.0\.0\.1|localhost|\[::1\]):(\d+)")


def _staging_steps(folder: Path, node: int) -> list[int]:
    """Steps whose checkpoint files a rank of `node` is writing or uploading right now."""
    found = []
    for path in (node_dir(folder, node) / "staging").glob("rank_*/step_*"):
        with contextlib.suppress(ValueError):
            found.append(int(path.name.removeprefix("step_")))
    return found


def _saving_folders(folder: Path, node: int) -> list[str]:
    """`--ckpt-dir` units `node` is writing or uploading right now (`ckptdir.py` says;
    folders end with `/`)."""
    try:
        return [str(name) for name in json.loads(saving_path(folder, node).read_text())]
    except (OSError, ValueError):
        return []


def _wait_for_save(folder: Path, node: int, timeout: float) -> int | str:
    """Wait until a rank of `node` writes a checkpoint (mncloud's, or a `--ckpt-dir` folder);
    return its step (or the folder's name)."""
    deadline = time.monotonic() + timeout
    while not (steps := _staging_steps(folder, node)):
        if names := _saving_folders(folder, node):
            return names[-1]
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


def _while(step: int | str | None) -> str:
    if step is None:
        return ""
    return f" while it saved step {step}" if isinstance(step, int) else f" while it saved {step}"


def preempt_node(
    folder: Path,
    node: int,
    *,
    by: str = "mncloud chaos",
    during_save: bool = False,
    save_timeout: float = 120.0,
) -> dict[str, Any]:
    """SIGKILL every process of `node`, like a spot VM vanishing; return the chaos record.

    The node's `--ckpt-dir` folder is lost with it (`ckptdir.lose_disk`): nothing of it
    reaches the bucket after the kill. With `during_save`, wait until a rank of that node is
    writing a checkpoint (its staging folder holds a step, or a `--ckpt-dir` unit of it is not
    in the bucket yet) and kill it then, leaving that step (or folder) torn.
    """
    launch = load_launch(folder)
    deadline = time.monotonic() + save_timeout
    while True:
        step = _wait_for_save(folder, node, deadline - time.monotonic()) if during_save else None
        with lose_disk(folder, node) as keep_disk:
            if isinstance(step, str):  # a --ckpt-dir unit: still not in the bucket?
                if not (names := _saving_folders(folder, node)):
                    keep_disk()
                    continue  # its upload ended meanwhile: strike at the next save
                step = names[-1]
            record: dict[str, Any] = {"t": time.time(), "action": "preempt", "node": node,
                                      "by": by}  # fmt: skip
            record["message"] = f"{by}: preempting node {node}{_while(step)} (SIGKILL)"
            record["during_save_step"] = step
            append_jsonl(folder / CHAOS_FILE, record)
            record["pids"] = kill_tagged(launch.token, node)
            if not record["pids"]:
                keep_disk()  # nothing ran there: the node had ended (its folder flushes)
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
    from mncloud.backends.local.metadata import PROTOCOLS

    if protocol not in PROTOCOLS:
        raise BackendError(f"--cloud-protocol {protocol}: use one of {', '.join(PROTOCOLS)}")
    step = _wait_for_save(folder, node, save_timeout) if during_save else None
    now = time.time()
    where = _while(step)
    record: dict[str, Any] = {
        "t": now, "action": "notice", "node": node, "protocol": protocol,
        "notice_s": notice_s, "deadline": now + notice_s, "during_save_step": step,
        "message": f"mncloud chaos: {protocol} preemption notice to node {node}{where}; "
                   f"it goes in {notice_s:g}s",
    }  # fmt: skip
    append_jsonl(folder / CHAOS_FILE, record)
    return record


def storage_outage(folder: Path, seconds: float) -> Iterator[str]:
    """Make the run's bucket unreachable for `seconds`; yields progress lines.

    `file://` buckets get the outage marker (every operation fails as if the server were
    down); an S3/GCS endpoint on this machine (AWS_ENDPOINT_URL / STORAGE_EMULATOR_HOST at
    `up`) is frozen with SIGSTOP and thawed with SIGCONT, so requests hang as on a network
    partition. A real cloud bucket cannot be taken down: BackendError. An interrupted outage
    (the generator closed, or an exception at its `sleep`) ends at once, its `end` line written.
    """
    from mncloud.storage import BucketURL

    launch = load_launch(folder)
    chaos = folder / CHAOS_FILE

    def note(message: str, **data: Any) -> str:
        append_jsonl(chaos, {"t": time.time(), "action": "storage-outage", "message": message,
                             **data})  # fmt: skip
        return message

    if BucketURL.parse(launch.ckpt_uri, check_name=False).scheme == "file":
        yield from _file_outage(launch.ckpt_uri, seconds, note)
        return
    endpoint = launch.storage_endpoint or ""
    match = _LOCAL_ENDPOINT.match(endpoint)
    if not match:
        raise BackendError(
            f"cannot take {launch.ckpt_uri} down: chaos storage-outage needs a file:// bucket "
            "or an S3/GCS server on this machine (AWS_ENDPOINT_URL=http://127.0.0.1:PORT)"
        )
    pid = listener_pid(int(match[2]))
    if pid is None:
        raise BackendError(f"nothing listens on {endpoint}; is the storage server running?")
    try:
        with _frozen(pid):
            yield note(f"storage outage: server {endpoint} (pid {pid}) frozen for {seconds:g}s",
                       phase="start", pid=pid)  # fmt: skip
            time.sleep(seconds)
    finally:
        over = note(f"storage outage over: server {endpoint} answers again", phase="end",
                    pid=pid)  # fmt: skip
    yield over


def _file_outage(uri: str, seconds: float, note: Any) -> Iterator[str]:
    from mncloud.storage import set_simulated_outage

    set_simulated_outage(uri, True)
    try:
        yield note(f"storage outage: {uri} unreachable for {seconds:g}s", phase="start")
        time.sleep(seconds)
    finally:  # also when interrupted (Ctrl-C, or SIGTERM/SIGHUP as the CLI raises them)
        set_simulated_outage(uri, False)
        over = note(f"storage outage over: {uri} reachable again", phase="end")
    yield over


@contextlib.contextmanager
def _frozen(pid: int) -> Iterator[None]:
    """SIGSTOP a process for the block, SIGCONT after (even on error or Ctrl-C)."""
    proc = psutil.Process(pid)
    proc.suspend()
    try:
        yield
    finally:
        with contextlib.suppress(psutil.NoSuchProcess):
            proc.resume()
