"""Each local node's "VM": one warm host per node while the node is up, for every local run.

When the supervisor starts a node it makes sure the node has a host (`warmhost.py`, the
supervisor's child, tagged as the node: `<token>/N`) that imports torch once, and puts
`nodes/node-N/vm/` first on the node's PATH: `python` and `torchrun` there are the client
(`warmclient.py`), which hands the command to the host to fork. So the preflight
(`python -m mncloud.doctor node`), torchrun's agent (`-m torch.distributed.run`) and every
worker (torchrun's `PYTHON_EXEC`) start with torch already imported; torchrun stays real and
the rendered run.sh is the cloud's. A client that finds the host still importing waits for it.

A host is the node's VM: `chaos preempt` (or a notice's deadline) kills it with the node's other
processes, and a node lost or preempted in any other way loses it at the relaunch
(`drop`): its replacement starts cold. A node that outlives a gang relaunch keeps its host, as
SkyPilot's FAILOVER recovery (what a cloud run of 2+ nodes renders, `render._job_recovery`)
relaunches on the same cluster first, keeping its live VMs. Each host records when it booted;
a bandwidth figure older than any node is never reused (`bandwidth_env`). The run's end,
`down`, and the supervisor's death end every host (a host exits when its parent is gone).

    t=0     attempt 1: hosts 0 and 1 boot (import torch, ~2 s CPU each); preflight, torchrun
            and 2 workers per node are forked from them; the bandwidth test publishes its figure
    t=20    chaos preempt node 1: its host dies with it; node 0's launcher, torchrun and
            workers are killed for the gang relaunch, its host is kept
    t=22    attempt 2: node 1's host boots again; its boot is newer than the figure, so the
            preflight measures the bandwidth again (a relaunch after an error, on the same
            two hosts, reuses it instead; `--preflight-always` measures every launch)
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import psutil

from mncloud import constants
from mncloud.backends.local import processes
from mncloud.backends.local.nodes import with_site_hook
from mncloud.backends.local.state import SUPERVISOR_LOG, LocalLaunch, node_dir, run_id_of
from mncloud.backends.local.warmhost import SOCKET, STARTING

VM_DIR = "vm"
NO_IDLE_S = 7 * 24 * 3600.0
"""A node's host never ends for idleness: it lives as long as its node (the supervisor)."""


def vm_dir(folder: Path, node: int) -> Path:
    return node_dir(folder, node) / VM_DIR


class NodeHosts:
    """The hosts of one run's nodes, kept by the supervisor (see the module docstring)."""

    def __init__(self, folder: Path, launch: LocalLaunch) -> None:
        self.folder, self.launch = folder, launch
        self._procs: dict[int, subprocess.Popen[bytes]] = {}
        self.booted: dict[int, float] = {}
        """By node: when its current host started."""

    def up(self, node: int, path: str = "") -> dict[str, str]:
        """Make sure `node` has a live host; what its run.sh's environment gets for it (the
        host's folder first on `path`, the node's PATH)."""
        proc = self._procs.get(node)
        if proc is None or not processes.pid_alive(proc.pid):
            self.drop(node)
            self._boot(node)
        here = vm_dir(self.folder, node)
        return {"PATH": os.pathsep.join(p for p in (str(here), path) if p),
                "PYTHON_EXEC": str(here / "python")}  # fmt: skip

    def _boot(self, node: int) -> None:
        here = vm_dir(self.folder, node)
        here.mkdir(parents=True, exist_ok=True)
        client = Path(__file__).with_name("warmclient.py").read_text()
        shebang = f"#!{sys.executable} -IS\n"
        torchrun = 'import sys\nsys.argv[1:1] = ["-m", "torch.distributed.run"]\n'
        for name, text in (("python", client), ("torchrun", torchrun + client)):
            exe = here / name
            exe.write_text(shebang + text)
            exe.chmod(exe.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
        with contextlib.suppress(FileNotFoundError):
            (here / SOCKET).unlink()  # an earlier host's
        threads = str(self.launch.cpu_threads)
        env = dict(os.environ)  # libgomp and MKL read their thread counts when torch loads
        env.update({"OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads})
        # The site hook in the host itself (`nodes.site_hook`): a forked worker never starts an
        # interpreter of its own, so the hook's torch fix and import watcher must be the host's.
        with_site_hook(env, self.folder)
        env[constants.LOCAL_NODE_TAG_ENV] = processes.node_tag(self.launch.token, node)
        command = [sys.executable, "-m", processes.SUPERVISOR_MODULE, "host", str(here),
                   str(NO_IDLE_S), str(os.getpid())]  # fmt: skip
        with open(self.folder / SUPERVISOR_LOG, "ab") as log:
            self._procs[node] = subprocess.Popen(
                command, env=env, stdin=subprocess.DEVNULL, stdout=log,
                stderr=subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip
        # Clients wait for a host still importing (before run.sh starts: no race to run cold).
        (here / STARTING).write_text(str(self._procs[node].pid))
        self.booted[node] = time.time()

    def pids(self, nodes: set[int] | None = None) -> set[int]:
        """The live hosts (of `nodes`, else of all)."""
        return {
            p.pid
            for n, p in self._procs.items()
            if (nodes is None or n in nodes) and processes.pid_alive(p.pid)
        }

    def drop(self, node: int) -> None:
        """`node`'s VM is gone (lost, preempted): SIGKILL its host, forget its boot."""
        proc = self._procs.pop(node, None)
        self.booted.pop(node, None)
        if proc is not None:
            with contextlib.suppress(psutil.Error):
                psutil.Process(proc.pid).kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=10)

    def keep(self, lost: set[int] | None) -> set[int]:
        """Before a relaunch: drop the `lost` nodes' hosts, return the others' pids (spared);
        at the end (`lost` None): stop every host, spare none."""
        if lost is None:
            self.stop()
            return set()
        for node in lost:
            self.drop(node)
        return self.pids()

    def stop(self) -> None:
        """The run ended: every host goes."""
        for node in list(self._procs):
            self.drop(node)

    def bandwidth_env(self, always: bool) -> dict[str, str]:
        """For a launch on these hosts: the run's published bandwidth figure to reuse
        (`constants.BANDWIDTH_KNOWN_ENV`) when every node booted before it was measured;
        {} (measure again) when a node is newer, there is none, or `always`."""
        launch = self.launch
        if always or launch.num_nodes < 2 or len(self.booted) < launch.num_nodes:
            return {}
        from mncloud.doctor import bandwidth

        figure = None
        with contextlib.suppress(Exception):  # unreadable: measure again
            figure = bandwidth.read(launch.ckpt_uri, run_id_of(launch))
        if figure is None or figure.get("nodes") != launch.num_nodes:
            return {}
        at = float(figure.get("at") or 0.0)
        if any(booted >= at for booted in self.booted.values()):
            return {}
        return {constants.BANDWIDTH_KNOWN_ENV: json.dumps(figure)}
