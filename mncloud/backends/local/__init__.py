"""The local backend: the rendered SkyPilot task on N simulated nodes of this machine.

`mncloud up train.py --cloud local --nodes 2 --gpus cpu:2` renders the task exactly as for a
cloud; this package then executes *that* task: `setup` once per node, then `run` on every
node with the variables SkyPilot sets, plus `MNCLOUD_CKPT_URI` (`--bucket`, else
`file://<run folder>/checkpoints`). The nodes run real `torchrun` (gloo over loopback).

    backend.py     LocalBackend (the `Backend` interface): launch, status, logs, down, progress
    lifecycle.py   write a run folder, start its supervisor, stop it (no process survives)
    supervisor.py  the process that runs the nodes and relaunches them (SkyPilot's recovery)
    exits.py       what an attempt's exit codes mean (preempted, a storage outage, refused, an
                   error) and what follows: a relaunch, after which wait, or the end
    nodes.py       one node: SkyPilot's environment, its logs with node and rank prefixes
    processes.py   psutil: a node's processes by their env tag, liveness, ports
    chaos.py       preempt a node (with or without notice), take the bucket away
    metadata.py    the clouds' metadata servers on 127.0.0.1 (preemption notices)
    figures.py     live progress, recovery figures, the uninterrupted reference run
    state.py       the run folder's files and their models (launch.json, state.json)
    replacing.py   node recovery: a lost node replaced alone while the others train on
    recordwriter.py  the supervisor's run-record writer: which of its events become record
                     events, at what price, written from one thread of their own
    ckptdir.py     `--ckpt-dir` on local nodes: a folder per node, kept in the bucket
    resumecheck.py did an attempt resume from the `--ckpt-dir` unit it started with?
    execute.py     `mncloud exec` on a local run's own simulated nodes
    netcheck.py    `mncloud doctor --bandwidth RUN` on a live local run
    vm.py          each node's warm host while it is up (its "VM"): python and torchrun on
                   its PATH fork from it; the bandwidth figure reused on the same nodes
    warm.py        warm node hosts of a local `up --cluster` run, kept up between runs
    warmhost.py    a warm node host: one Python per node that imported torch once
    warmclient.py  the `PYTHON_EXEC` of a node on a warm host
    warmrun.py     inside a warm host's forked child: become the worker asked for
    __main__.py    `python -m mncloud.backends.local supervise RUN_FOLDER`

A new `up` with the name of a finished run keeps its local checkpoints (`--resume`
continues from them); pass `--bucket` to keep checkpoints elsewhere.
"""

from mncloud.backends.local.backend import LocalBackend
from mncloud.backends.local.processes import free_port

__all__ = ["LocalBackend", "free_port"]
