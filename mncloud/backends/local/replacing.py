"""Node recovery on the local backend: a lost node is replaced alone; the others train on.

With `--recovery node` the supervisor (`supervisor.py`) owns one torchft lighthouse per attempt
(`torchft_lighthouse` on 127.0.0.1, a free port, tagged like a node so `down` finds it) and
points every node at it (`TORCHFT_LIGHTHOUSE`). Example, 3 nodes, `--provision-delay 10s`:

    t=0     attempt 1: lighthouse, then run.sh on nodes 0-2 (one standalone torchrun each)
    t=30    `chaos preempt demo --node 1`: node 1's processes are SIGKILLed
    t=30.1  node 1 vanished, 2 of 3 alive >= 2 needed: node-lost, node 1 "replacing"; nodes
            0 and 2 drop it from the quorum within seconds and keep stepping
    t=40    the modeled provisioning is over: run.sh on node 1 alone ("healing")
    t=52    node 1's replica joins the quorum (node-joined) and heals from a live peer
            (node-healed, "running"); nodes 0 and 2 never stopped: same process ids
    t=60    every node exits 0 → SUCCEEDED

When fewer than `min_replicas` nodes would be left (two of three lost at once), the loss is
handed back to the supervisor, which relaunches the whole gang from the bucket checkpoint.
Join, heal and quorum news come from the replicas themselves (`mncloud.train.Replicas` records
them as events in the run's telemetry segments, written at once), read here as segments come
(`telemetry.seriestail`).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from mncloud import constants, layout
from mncloud.backends.local.processes import LOCALHOST, free_port, node_tag
from mncloud.backends.local.state import LIGHTHOUSE_LOG, LocalLaunch, LocalState, run_id_of
from mncloud.telemetry.seriestail import SeriesTail

LIGHTHOUSE_NODE = "lighthouse"
"""The lighthouse's process tag suffix (`<token>/lighthouse`)."""
HEARTBEAT_TIMEOUT_MS = 2000
"""A replica silent this long leaves the quorum: how fast survivors go on without a node."""
JOIN_TIMEOUT_MS = 2000


def lighthouse_command(min_replicas: int, port: int) -> list[str]:
    """torchft's lighthouse, bound to loopback only."""
    exe = shutil.which("torchft_lighthouse", path=str(Path(sys.executable).parent))
    return [
        exe or "torchft_lighthouse",
        "--min_replicas", str(min_replicas),
        "--bind", f"{LOCALHOST}:{port}",
        "--heartbeat_timeout_ms", str(HEARTBEAT_TIMEOUT_MS),
        "--join_timeout_ms", str(JOIN_TIMEOUT_MS),
        "--quorum_tick_ms", "100",
    ]  # fmt: skip


class NodeReplacer:
    """Replaces lost nodes one by one during an attempt (see the module docstring).

    `event(kind, message, node, **data)` is the supervisor's event writer; `start(node)` starts
    a node's run.sh and returns its process.
    """

    def __init__(
        self,
        folder: Path,
        launch: LocalLaunch,
        state: LocalState,
        event: Callable[..., None],
        start: Callable[[int], subprocess.Popen[bytes]],
    ) -> None:
        self.folder, self.launch, self.state = folder, launch, state
        self._event, self._start = event, start
        self.lighthouse: subprocess.Popen[bytes] | None = None
        self.lighthouse_url = ""
        self._due: dict[int, float] = {}
        """Nodes being provisioned → when their replacement starts."""
        self._joining: set[int] = set()
        self._news_uri = layout.series_uri(launch.ckpt_uri, run_id_of(launch))
        self._tail = SeriesTail(self._news_uri)
        self._since = 0.0

    # ------------------------------------------------------------------ per attempt
    def start_attempt(self) -> dict[str, str]:
        """Start a fresh lighthouse for a new attempt; the env every node gets."""
        self.stop_lighthouse()
        port = free_port()
        env = dict(os.environ)
        env[constants.LOCAL_NODE_TAG_ENV] = node_tag(self.launch.token, LIGHTHOUSE_NODE)
        env.setdefault("RUST_LOG", "info")
        log = open(self.folder / LIGHTHOUSE_LOG, "ab")  # noqa: SIM115
        self.lighthouse = subprocess.Popen(
            lighthouse_command(self.launch.min_replicas, port),
            env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
        log.close()
        self.lighthouse_url = f"http://{LOCALHOST}:{port}"
        self._due.clear()
        self._joining.clear()
        self.state.quorum = []
        self._tail = SeriesTail(self._news_uri)
        self._tail.skip()  # news of earlier attempts: left unread
        self._since = time.time()
        return {constants.LIGHTHOUSE_ENV: self.lighthouse_url}

    def stop_lighthouse(self) -> None:
        if self.lighthouse is not None and self.lighthouse.poll() is None:
            self.lighthouse.kill()
            self.lighthouse.wait(timeout=10)
        self.lighthouse = None

    # ------------------------------------------------------------------ while watching
    def take_losses(
        self, codes: dict[int, int | None], requested: set[int], now: float
    ) -> dict[int, int | None]:
        """Replace nodes that were preempted while enough others live; the codes left for the
        supervisor (a replaced node reads as still running; a loss too many stays)."""
        out = {n: None if n in self._due else c for n, c in codes.items()}
        lost = [n for n, c in out.items() if _preempted(c, n in requested)]
        if not lost:
            return out
        alive = sum(1 for n, c in out.items() if c is None and n not in self._due)
        if alive < self.launch.min_replicas:
            return codes  # too many gone at once: a whole-gang relaunch from the bucket
        for node in lost:
            self._lose(node, codes[node], now)
            out[node] = None
        return out

    def due(self, now: float) -> list[int]:
        """Nodes whose modeled provisioning is over: start them now."""
        ready = [n for n, t in self._due.items() if t <= now]
        for node in ready:
            del self._due[node]
            self._joining.add(node)
            self.state.nodes[node].status = "healing"
            self.state.nodes[node].replacements += 1
        return ready

    def replacing(self, node: int) -> bool:
        return node in self._due

    def read_progress(self) -> None:
        """Take the replicas' join, heal and quorum news from the segments written since the
        last call; a node whose replacement steps is running."""
        news = self._tail.read()
        for e in news.events:
            if e.node is not None and e.t >= self._since:
                self._news({"t": e.t, "event": e.event, **e.data, "node": e.node})
        for node in {r.node for r in news.steps if r.node is not None and r.t >= self._since}:
            if 0 <= node < len(self.state.nodes) and self.state.nodes[node].status == "healing":
                self.state.nodes[node].status = "running"  # stepping (no heal needed)

    # ------------------------------------------------------------------ internals
    def _lose(self, node: int, code: int | None, now: float) -> None:
        from mncloud.backends.local.processes import describe_exit

        delay = self.launch.recovery_delay
        self._due[node] = now + delay
        self._joining.discard(node)
        record = self.state.nodes[node]
        record.status, record.exit_code, record.ended_at = "replacing", code, now
        self.state.preemptions += 1
        what = describe_exit(code) if code is not None else "was preempted"
        left = self.launch.num_nodes - len(self._due)
        self._event("node-lost", f"node {node} {what} (preempted); {left} node(s) train on, a "
                    f"replacement starts in {delay:g}s (modeled provisioning)", node=node,
                    exit_code=code, survivors=left)  # fmt: skip

    def _news(self, record: dict[str, Any]) -> None:
        node, kind = int(record["node"]), record.get("event")
        if not 0 <= node < len(self.state.nodes):
            return
        at = float(record.get("t") or time.time())
        if kind == "quorum" and isinstance(record.get("replicas"), list):
            replicas = sorted(int(r) for r in record["replicas"])
            if replicas != self.state.quorum:
                self.state.quorum = replicas
        elif kind == "join" and node in self._joining:
            self._joining.discard(node)
            step = record.get("step")
            self._event("node-joined", f"node {node}'s replacement joined at step {step}",
                        node=node, t=at, step=step)  # fmt: skip
        elif kind == "heal":
            self.state.nodes[node].status = "running"
            self._event("node-healed", f"node {node} healed from a live peer: step "
                        f"{record.get('from_step')} → {record.get('step')} in "
                        f"{record.get('seconds')}s", node=node, t=at, step=record.get("step"),
                        seconds=record.get("seconds"))  # fmt: skip


def _preempted(code: int | None, requested: bool) -> bool:
    """A node gone the way a spot VM goes: killed by a signal, exit 115, or chaos asked."""
    if code is None or code == 0:
        return False
    return code < 0 or code == constants.PREEMPTED_EXIT_CODE or requested
