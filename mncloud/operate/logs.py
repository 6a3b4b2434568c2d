"""`mncloud logs`: a run's lines through its backend's `logs`, with `--tail` and `--since`."""

from __future__ import annotations

import collections
from collections.abc import Iterator

from mncloud.backends.registry import backend_for_run


def run_logs(
    run_name: str,
    node: int | None = None,
    *,
    follow: bool = False,
    tail: int | None = None,
    since: float | None = None,
) -> Iterator[str]:
    """`mncloud logs`: the run's lines from every node (or `node`'s); with `since` (a time),
    only those written since then (BackendError from a backend whose logs carry no times);
    with `tail`, only the last `tail` of those, then, with `follow`, the new ones as they
    come."""
    backend = backend_for_run(run_name)

    def lines(follow_now: bool) -> Iterator[str]:
        return backend.logs(run_name, node=node, follow=follow_now, since=since)

    if tail is None:
        yield from lines(follow)
        return
    last: collections.deque[str] = collections.deque(maxlen=tail)
    seen = 0
    for line in lines(False):
        last.append(line)
        seen += 1
    yield from last
    if follow:  # the same lines again, then the new ones: skip those already counted
        for index, line in enumerate(lines(True)):
            if index >= seen:
                yield line
