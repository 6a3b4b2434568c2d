"""SkyPilot's logs of a run, re-split into lines and prefixed `[node N]` (`[sky]` for its own)."""

from __future__ import annotations

import re
from collections.abc import Iterator

from mncloud.backends.skypilot.errors import ANSI, sky_errors
from mncloud.backends.skypilot.meta import MANAGED_JOB, RunMeta

# SkyPilot prefixes each node's lines: "(head, rank=0, pid=412) ...",
# "(worker1, rank=1, pid=97, ip=10.0.0.5) ...", or "(train, pid=12) ..." on one node.
_NODE_PREFIX = re.compile(
    r"^\((?P<node>head|worker(?P<idx>\d+)|[^,()]+?)(?:, rank=(?P<rank>\d+))?, pid=\d+"
    r"(?:, ip=[^)]*)?\) ?"
)


def prefix_line(line: str) -> tuple[int | None, str]:
    """SkyPilot's node prefix → `[node N] text`; lines of SkyPilot's own get `[sky] `."""
    match = _NODE_PREFIX.match(line)
    if not match:
        return None, f"[sky] {line}"
    if match.group("rank") is not None:
        node = int(match.group("rank"))
    elif match.group("idx") is not None:
        node = int(match.group("idx"))
    else:
        node = 0
    return node, f"[node {node}] {line[match.end() :]}"


def tail_logs(meta: RunMeta, node: int | None, follow: bool) -> Iterator[str]:
    """The run's log lines from SkyPilot (its cluster job's or its managed job's)."""
    import sky

    with sky_errors(f"read the logs of {meta.name}"):
        if meta.kind == MANAGED_JOB:
            chunks = sky.jobs.tail_logs(job_id=meta.job_id, follow=follow, preload_content=False)
        else:
            chunks = sky.tail_logs(meta.name, meta.job_id, follow=follow, preload_content=False)
        yield from prefixed_lines(chunks, node)


def prefixed_lines(chunks: Iterator[str | None], node: int | None) -> Iterator[str]:
    """Re-split SkyPilot's log chunks into lines, prefix them, keep only `node`'s if asked."""
    pending = ""
    for chunk in chunks:
        if chunk is None:
            break
        pending += chunk
        *lines, pending = pending.split("\n")
        for line in lines:
            yield from _keep(line.rstrip("\r"), node)
    if pending:
        yield from _keep(pending.rstrip("\r"), node)


def _keep(line: str, node: int | None) -> Iterator[str]:
    which, text = prefix_line(ANSI.sub("", line))
    if node is None or which == node:
        yield text
