"""The supervisor: one process per local run that launches the nodes and relaunches them.

It mirrors SkyPilot's managed-job recovery (`exits.py`: what each ending means). A node that
*vanishes* (its launcher killed by a signal, as `chaos preempt` does) or exits with
`PREEMPTED_EXIT_CODE` is a preemption and is recovered, always, and counted apart
(`preemptions`); nodes that exit `STORAGE_OUTAGE_EXIT_CODE` (their bucket did not answer) are a
storage outage, recovered after a backoff and counted apart (`outages`); a node that exits
non-zero otherwise is an error in the user's code and is retried `--max-restarts` times
(SkyPilot's `max_restarts_on_errors`, the same meaning on a cloud). `restarts` counts every
relaunch, of any kind. Example, 2 nodes, `--recovery-delay 2s`:

    t=0     setup.sh on node 0, then node 1 (same folder, like a shared image)
    t=1     attempt 1: run.sh on both nodes; torchrun rendezvous on 127.0.0.1:<free port>
    t=20    `chaos preempt demo --node 1`: a line in chaos.jsonl, then SIGKILL to every process
            of node 1 (launcher, torchrun, workers)
    t=20.1  supervisor: node 1's launcher died of SIGKILL and chaos asked for it → preempted.
            It SIGKILLs node 0 too (a cloud tears the whole cluster down), restarts = 1.
    t=22    attempt 2: both nodes relaunched, same SKYPILOT_TASK_ID; the script's
            CheckpointManager.load() resumes from the newest COMPLETE step
    t=40    both nodes exit 0 → SUCCEEDED

Every Python of a node (preflight, torchrun, workers) forks from the node's warm host
(`vm.py`): a lost node's host goes with it, a survivor's is kept for the relaunch.

Preemption *with notice* goes through the run's metadata server (`metadata.py`; the timeline
is in `chaos.py`): after a node exits 115, the others get `NOTICE_EXIT_GRACE_S` to do the same
before the preemption is counted. Each relaunch resets the metadata (fresh VMs).

`--chaos-preempt-after D` does what `chaos preempt` does to the last node, once, D after the
first training step the script reports in its telemetry segments (or D + 60 s after the
launch when it reports none), so the preemption lands mid-training however long start-up takes.
On SIGTERM (`mncloud down --now`) it SIGKILLs every node process and records CANCELLED. On
SIGUSR1 with a `stop` request in chaos.jsonl (`mncloud down`, and the deadline controller's
stops) it stops gracefully: a preemption notice to every node that watches its metadata, up to
the request's `notice_s` for the nodes to save the step they reached and exit (115), SIGKILL
to any node left at that deadline, then CANCELLED with the newest complete checkpoint, and no
relaunch. During setup, a recovery wait or while no node watches, the stop is immediate.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
from datetime import datetime
from pathlib import Path
from typing import Any

from mncloud import constants, layout
from mncloud.backends.base import RunState
from mncloud.backends.local import processes, warm
from mncloud.backends.local.chaos import preempt_node
from mncloud.backends.local.ckptdir import CkptDirSync
from mncloud.backends.local.exits import Outcome, end_tail, ending, next_launch
from mncloud.backends.local.metadata import MetadataServer
from mncloud.backends.local.nodes import RunLogs, node_env, refusal, start_node
from mncloud.backends.local.recordwriter import RecordWriter
from mncloud.backends.local.replacing import NodeReplacer
from mncloud.backends.local.resumecheck import (
    SCRATCH,
    ResumeCheck,
    newest_complete_step,
    saved_line,
)
from mncloud.backends.local.state import (
    CHAOS_FILE,
    Event,
    NodeRecord,
    load_launch,
    load_state,
    read_jsonl,
    run_id_of,
    save_state,
)
from mncloud.backends.local.vm import NodeHosts
from mncloud.storage.folderrestore import NoRoom
from mncloud.telemetry.seriestail import SeriesTail

POLL_S = 0.1
NOTICE_EXIT_GRACE_S = 10.0
"""After a node exits for a preemption notice, how long the others get to do the same."""
CHAOS_NO_PROGRESS_S = 60.0


class Supervisor:
    """Runs the nodes of one run, relaunching them after a preemption (see module docstring)."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.launch = load_launch(folder)
        self.state = load_state(folder)
        self.stop = threading.Event()
        """Set by SIGTERM (stop now) and SIGUSR1 (stop after a preemption notice)."""
        self.stop_now = threading.Event()
        self._stop_request: dict[str, Any] | None = None
        self._stop_note = ""
        self.logs = RunLogs(folder, self.launch.num_nodes)
        self._records = RecordWriter(self.launch.name, self.launch.procs_per_node, self.logs,
                                     self.launch.spot, self.launch.hourly_price,
                                     self.launch.ckpt_uri)  # fmt: skip
        self._chaos_lines = 0
        self._preempt_requests: list[dict[str, Any]] = []
        self._procs: dict[int, subprocess.Popen[bytes]] = {}
        self._first_step_t: float | None = None
        series = layout.series_uri(self.launch.ckpt_uri, run_id_of(self.launch))
        self._steps = SeriesTail(series)
        self._resumed = ResumeCheck(series)  # --ckpt-dir: did each attempt resume?
        # Every node's cloud metadata (AWS, GCP, Azure): "no notice" until `chaos preempt
        # --notice` flips one; the node is killed at the notice's deadline if still running.
        self._metadata = MetadataServer()
        self._notice_kills: list[tuple[float, int, int]] = []  # (deadline, node, attempt)
        # --ckpt-dir: each node's folder, kept in the bucket like a MOUNT_CACHED mount.
        self._ckpt_dir = (
            CkptDirSync(folder, self.launch, self.logs.write)
            if constants.CKPT_DIR_ENV in self.launch.envs
            else None
        )
        # --recovery node: a lost node is replaced alone while the others train on.
        self._replacer = (
            NodeReplacer(folder, self.launch, self.state, self.event, self._replace)
            if self.launch.recovery == "node"
            else None
        )
        self._node_env: dict[str, str] = {}
        self._hosts = warm.Hosts(folder, self.launch)  # `up --cluster`
        self._vms = NodeHosts(folder, self.launch)  # each node's warm host (vm.py)

    # ------------------------------------------------------------------ plumbing
    def _save(self) -> None:
        save_state(self.folder, self.state)

    def event(
        self, kind: str, message: str, node: int | None = None, t: float | None = None, **data: Any
    ) -> None:
        now, attempt = t or time.time(), self.state.attempt
        self.state.events.append(
            Event(t=now, kind=kind, message=message, attempt=attempt, node=node, data=data)
        )
        self.state.detail = message
        self._save()
        self.logs.write(f"[mncloud {datetime.fromtimestamp(now):%H:%M:%S}] {message}")
        billed = sum(n.status != "replacing" for n in self.state.nodes)
        self._records.supervisor_event(
            kind, message, node, now, attempt, self.state.events, billed, self.launch.num_nodes
        )

    def _start(
        self, node: int, script: str, label: str, extra: dict[str, str] | None = None
    ) -> subprocess.Popen[bytes]:
        env = node_env(self.launch, self.folder, node, metadata_url=self._metadata.url(node),
                       setup=script == "setup.sh")  # fmt: skip
        env.update(self._node_env)
        env.update(extra or {})
        if self._ckpt_dir is not None:
            self._ckpt_dir.node_env(node, env)
        if script == "run.sh":  # forked from the node's host (a `--cluster` host for exec)
            env.update(self._vms.up(node, env.get("PATH", "")))
            env.update(self._hosts.env(node))
        proc = start_node(self.launch, self.folder, node, script, env)
        assert proc.stdout is not None
        self.logs.follow(node, proc.stdout, label)
        return proc

    def _replace(self, node: int) -> subprocess.Popen[bytes]:
        """Start a replacement for `node` alone (node recovery)."""
        # Alone: its preflight has no gang to meet (the fabric was measured at the start).
        replacement = {constants.REPLACEMENT_ENV: "1"}
        self._vms.drop(node)  # a new VM: its replacement starts cold
        if self._ckpt_dir is not None:
            self._ckpt_dir.replace_node(node)  # and its --ckpt-dir folder comes from the bucket
        proc = self._procs[node] = self._start(node, "run.sh", "", replacement)
        record = self.state.nodes[node]
        record.launcher_pid, record.pids, record.started_at = proc.pid, [proc.pid], time.time()
        record.exit_code = record.ended_at = None
        self.event("node-start", f"node {node}'s replacement started (replacement "
                   f"{record.replacements})", node=node, pids=[proc.pid])  # fmt: skip
        return proc

    def _kill_all(self, lost: set[int] | None = None) -> None:
        """Every process of the run; with `lost` (a relaunch follows), the hosts of the other
        nodes are kept (their VMs live on)."""
        keep = self._vms.keep(lost)
        processes.kill_tagged(self.launch.token, exclude=keep)
        self._hosts.wait_workers_gone()  # their clients died: the hosts kill them
        if self._replacer is not None:
            self._replacer.stop_lighthouse()
        for proc in self._procs.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=10)
        self.logs.drain()
        processes.reap_orphans(keep)

    def _ingest_chaos(self) -> None:
        lines = read_jsonl(self.folder / CHAOS_FILE)
        for record in lines[self._chaos_lines :]:
            if record.get("action") == "preempt":
                self._preempt_requests.append(record)
            if record.get("action") == "notice":
                node, deadline = int(record["node"]), float(record["deadline"])
                self._metadata.announce(node, str(record["protocol"]), deadline)
                self._notice_kills.append((deadline, node, self.state.attempt))
            if record.get("action") == "stop":
                self._stop_request = record
                self.event("stopping", str(record.get("message", "")), t=record.get("t"))
                continue
            data = {k: v for k, v in record.items() if k not in ("t", "message", "node")}
            self.event(f"chaos-{record.get('action')}", str(record.get("message", "")),
                       node=record.get("node"), t=record.get("t"), **data)  # fmt: skip
        self._chaos_lines = len(lines)

    # ------------------------------------------------------------------ phases
    def main(self) -> int:
        """Run setup, then attempts until success, failure or `down`; return an exit code."""
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: (self.stop_now.set(), self.stop.set()))
        signal.signal(signal.SIGUSR1, lambda *_: self.stop.set())
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
        processes.become_subreaper()
        st = self.state
        st.supervisor_pid = os.getpid()
        self._metadata.start()
        st.started_at = time.time()
        st.state = RunState.STARTING
        st.nodes = [NodeRecord(node=n) for n in range(self.launch.num_nodes)]
        self._save()
        self._hosts.begin(self.logs.write)
        try:
            final = self._run()
        except Exception as err:  # anything unexpected: stop the nodes, say why
            final = RunState.FAILED
            self.event("failed", f"supervisor error: {type(err).__name__}: {err}")
        finally:
            self._kill_all()
            if not self.stop.is_set():  # a run that ended before its first step
                self._hosts.start(first_step=False)
            self._metadata.stop()
            if self._ckpt_dir is not None:
                self._ckpt_dir.stop()
        self._finish(final)
        self._records.flush()
        self.logs.close()
        return 0 if final is RunState.SUCCEEDED else 1

    def _finish(self, final: RunState) -> None:
        """Record the end. The detail is a sentence of its own ("succeeded after 1 restart,
        1 preemption"): `up` prints it alone, without the state word it would repeat."""
        st = self.state
        st.state, st.ended_at = final, time.time()
        for record in st.nodes:
            record.pids = []
            if record.status != "finished":
                record.status = "finished" if final is RunState.SUCCEEDED else "stopped"
        tail = end_tail(st)
        if final is RunState.FAILED:
            detail = st.detail if st.detail.startswith(("failed", "supervisor")) else "failed"
            self.event("failed", detail)
        elif final is RunState.SUCCEEDED:
            self.event("succeeded", f"succeeded after {tail}")
        else:
            by = str((self._stop_request or {}).get("by") or "mncloud down")
            self.event(final.value.lower(), f"stopped by {by}{self._stop_note} after {tail}")

    def _run(self) -> RunState:
        if self.launch.setup and not self._setup():
            return RunState.CANCELLED if self.stop.is_set() else RunState.FAILED
        outages = 0  # storage outages in a row: their backoff grows
        while True:
            outcome, message = self._attempt()
            if outcome == "succeeded":
                return RunState.SUCCEEDED
            if outcome == "stopped":
                return RunState.CANCELLED
            outages = outages + 1 if outcome == "outage" else 0
            after = next_launch(self.state, self.launch, outcome, message, outages)
            if after is None:
                return RunState.FAILED
            delay, why = after
            self.state.state = RunState.RECOVERING
            self.event("recovering", f"relaunching all nodes in {delay:g}s ({why})")
            if self.stop.wait(delay):
                return RunState.CANCELLED

    def _setup(self) -> bool:
        """setup.sh on each node in turn; False when one fails or `down` stops it."""
        for node in range(self.launch.num_nodes):
            self.event("setup", f"setup on node {node}", node=node)
            proc = self._procs[node] = self._start(node, "setup.sh", " setup")
            while proc.poll() is None:
                if self.stop.wait(POLL_S):
                    return False
            self._kill_all()
            if proc.returncode != 0:
                what = processes.describe_exit(proc.returncode)
                self.state.detail = f"failed: setup on node {node} {what}"
                return False
        return True

    def _launch_nodes(self) -> float:
        """Start run.sh on every node for a new attempt; return its start time."""
        la, st = self.launch, self.state
        st.attempt += 1
        started = time.time()
        self._metadata.clear()  # a relaunch gets fresh VMs
        unit = None
        if self._ckpt_dir is not None:
            self._ckpt_dir.start_attempt()
            unit = self._ckpt_dir.resume_from()
        self._resumed.start(st.attempt, unit, started)
        self._procs = {}
        if self._replacer is not None:
            self._node_env = self._replacer.start_attempt()
        for node in range(la.num_nodes):
            self._vms.up(node)
        figure = self._vms.bandwidth_env(la.preflight_always)  # reused when no node is newer
        for node in range(la.num_nodes):
            proc = self._procs[node] = self._start(node, "run.sh", "", figure)
            st.nodes[node] = NodeRecord(
                node=node, launcher_pid=proc.pid, pids=[proc.pid], started_at=time.time(),
                status="running", replacements=st.nodes[node].replacements,
            )  # fmt: skip
        st.state = RunState.RUNNING
        self.event("launch", f"attempt {st.attempt}: {la.num_nodes} node(s) × "
                   f"{la.procs_per_node} process(es) started", pids=[p.pid for p in
                   self._procs.values()], resume_from=unit)  # fmt: skip
        return started

    def _attempt(self) -> tuple[Outcome, str]:
        """One launch of all nodes; its outcome (`exits.py`) and one line."""
        try:
            started = self._launch_nodes()
        except NoRoom as err:  # the same disk at every retry: refused, one line
            return "refused", str(err)
        codes = self._watch(started)
        if codes is None:
            self._end_ckpt_dir(self._stopped_codes())
            return "stopped", "stopped"
        self._ingest_chaos()  # a request written just before the kill we noticed
        for n, code in codes.items():
            if code is not None:
                self.state.nodes[n].exit_code, self.state.nodes[n].ended_at = code, time.time()
        failed = {n: c for n, c in codes.items() if c not in (None, 0)}
        if not failed:
            self._kill_all()
            self._end_ckpt_dir(codes)
            return "succeeded", "all nodes exited 0"
        requested = {int(r["node"]) for r in self._preempt_requests if r["t"] >= started}
        end = ending(codes, requested)
        self._kill_all(end.lost)  # first: no commit may land after we look at the bucket
        self._end_ckpt_dir(codes)
        latest, saved = self._saved(ask=end.outcome != "outage")
        self.event(end.outcome, f"{end.message}; {saved}",
                   node=end.node, exit_codes={str(k): v for k, v in codes.items()},
                   latest_checkpoint=latest)  # fmt: skip
        refused = refusal(self.folder, failed) if end.outcome == "error" else None
        return ("refused", refused) if refused else (end.outcome, end.message)

    def _end_ckpt_dir(self, codes: dict[int, int | None]) -> None:
        """--ckpt-dir: flush the folders of nodes that exited on their own; a node killed (or
        still running when the cluster went down) loses its folder."""
        if self._ckpt_dir is not None:
            self._ckpt_dir.end_attempt({n: c for n, c in codes.items() if c is not None and c >= 0})

    def _watch(self, started: float) -> dict[int, int | None] | None:
        """Poll the nodes until all exit 0 or one fails; their exit codes (None: `down`)."""
        chaos_pending = self.launch.chaos_preempt_after is not None and self.state.attempt == 1
        last_scan = 0.0
        stopping_until: float | None = None  # nodes stopping for a notice: let the rest follow
        stop_deadline: float | None = None  # stopping after a notice: nodes gone by then
        while True:
            if stop_deadline is None and self.stop.wait(POLL_S):
                self._ingest_chaos()  # the stop request, if `down` wrote one
                stop_deadline = self._notify_stop()
                if stop_deadline is None:
                    return None
            if stop_deadline is not None:
                if self.stop_now.wait(POLL_S) or self._stopped_by(stop_deadline):
                    return None
                continue
            self._ingest_chaos()
            now = time.time()
            if chaos_pending and self._chaos_due(started, now):
                chaos_pending = False
                preempt_node(self.folder, self.launch.num_nodes - 1, by="--chaos-preempt-after")
            self._kill_at_deadlines(now)
            codes = {n: p.poll() for n, p in self._procs.items()}
            if self._replacer is not None:
                codes = self._node_recovery(codes, now)
            failed = [c for c in codes.values() if c not in (None, 0)]
            if failed and all(c == constants.PREEMPTED_EXIT_CODE for c in failed):
                stopping_until = stopping_until or now + NOTICE_EXIT_GRACE_S
                if now < stopping_until and None in codes.values():
                    continue
            if failed or all(c == 0 for c in codes.values()):
                return codes
            if now - last_scan >= 1.0:
                last_scan = now
                self._refresh_pids()
                self._hosts.start()  # once the first step is reported
                restarted = self._resumed.poll()
                if restarted:
                    self.event(SCRATCH, restarted)
                processes.reap_orphans({p.pid for p in self._procs.values()} | self._vms.pids())

    def _notify_stop(self) -> float | None:
        """A graceful stop: a preemption notice to every node, if any of them watches its
        metadata; return the notice's deadline (None: stop now)."""
        request = self._stop_request
        watching = self._metadata.watching()
        if self.stop_now.is_set() or request is None or not watching:
            if request is not None and not self.stop_now.is_set():
                self.logs.write("[mncloud] no node watches for a preemption notice: stopping now")
            return None
        deadline = time.time() + float(request.get("notice_s") or 0.0)
        for node in range(self.launch.num_nodes):  # AWS's notice carries its deadline
            self._metadata.announce(node, "aws", deadline)
        self.event("notice", f"preemption notice to every node ({len(watching)} watching); "
                   f"they save the step they reached and stop within "
                   f"{deadline - time.time():.0f}s")  # fmt: skip
        return deadline

    def _stopped_by(self, deadline: float) -> bool:
        """Stopping after a notice: True once every node exited or the deadline passed."""
        codes = {n: p.poll() for n, p in self._procs.items()}
        if any(c is None for c in codes.values()) and time.time() < deadline:
            return False
        left = [n for n, c in codes.items() if c is None]
        self._kill_all()  # first: no commit may land after we look at the bucket
        killed = f"; node(s) {left} SIGKILLed at the notice's deadline" if left else ""
        self._stop_note = f" after a preemption notice ({self._saved()[1]}{killed})"
        return True

    def _stopped_codes(self) -> dict[int, int | None]:
        """The exit codes of nodes that stopped on their own (for --ckpt-dir's flush)."""
        return {n: p.returncode for n, p in self._procs.items()}

    def _node_recovery(self, codes: dict[int, int | None], now: float) -> dict[int, int | None]:
        """Node recovery: replace preempted nodes alone while enough others live, start the
        replacements whose provisioning is over, read the replicas' news (`replacing.py`)."""
        assert self._replacer is not None
        self._replacer.read_progress()
        requested = {
            int(r["node"]) for r in self._preempt_requests
            if r["t"] >= (self.state.nodes[int(r["node"])].started_at or 0.0)
        }  # fmt: skip
        for node in self._replacer.due(now):
            if all(c == 0 for n, c in codes.items() if n != node):  # the others finished it
                self.state.nodes[node].status, codes[node] = "finished", 0
                self.event("node-start", f"node {node} not replaced: every other node finished "
                           "the run", node=node)  # fmt: skip
                continue
            self._replace(node)
            codes[node] = None
        for node, code in codes.items():
            if code == 0 and self.state.nodes[node].status != "finished":
                self.state.nodes[node].status = "finished"
                self._save()
        return self._replacer.take_losses(codes, requested, now)

    def _kill_at_deadlines(self, now: float) -> None:
        """A node told it would be preempted and still running at the deadline is killed."""
        for deadline, node, attempt in list(self._notice_kills):
            if deadline > now:
                continue
            self._notice_kills.remove((deadline, node, attempt))
            if attempt == self.state.attempt and self._procs[node].poll() is None:
                preempt_node(self.folder, node, by="the notice's deadline")

    def _saved(self, ask: bool = True) -> tuple[int | None, str]:
        """The newest COMPLETE step in the bucket (None: none or unknown), and what a relaunch
        resumes from in words, with the newest committed `--ckpt-dir` unit; unknown when the
        bucket does not answer (not asked, `ask` False, after a storage outage)."""
        if not ask:
            return None, saved_line(None, None, answered=False)
        step, answered = newest_complete_step(self.launch.ckpt_uri)
        unit = self._ckpt_dir.newest_committed() if self._ckpt_dir is not None else None
        return step, saved_line(step, unit, answered=answered)

    def _chaos_due(self, started: float, now: float) -> bool:
        """`--chaos-preempt-after D`: D after the first step the script reports, else after
        launch (when no step is reported within D + CHAOS_NO_PROGRESS_S)."""
        delay = self.launch.chaos_preempt_after or 0.0
        if self._first_step_t is None:  # a launch's first step is written at once
            steps = [row.t for row in self._steps.read().steps if row.t >= started]
            self._first_step_t = min(steps, default=None)
        if self._first_step_t is not None:
            return now >= self._first_step_t + delay
        return now >= started + delay + CHAOS_NO_PROGRESS_S

    def _refresh_pids(self) -> None:
        changed = False
        for record in self.state.nodes:
            pids = processes.tagged_pids(self.launch.token, record.node)
            pids = sorted(pids + self._hosts.node_workers(record.node))  # forked by its host
            if pids != record.pids:
                record.pids, changed = pids, True
        if changed:
            self._save()
