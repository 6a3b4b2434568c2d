"""Preflight checks: name a broken setup in seconds instead of hanging a 32-GPU rendezvous.

Two places run them. `mncloud doctor` on the laptop: cloud credentials (SkyPilot's own checks,
with a deadline, since they may call the cloud), the bucket reachable and writable (a probe
object is written, read back and deleted), data paths in buckets. And every node, just before
torchrun (`python -m mncloud.doctor node …` in the rendered `run`): the GPUs visible equal the
request, the `--require-path` data paths exist, `NCCL_SOCKET_IFNAME` names a real interface,
the master address resolves, the bucket works from this node, and — across nodes — the master
is reachable on the rendezvous port, every node runs the same code (a hash of the workdir's
source files) and the node ranks and node count agree.

The gang check (design)
-----------------------
Before torchrun starts nothing listens on MASTER_PORT, so a plain "connect to the master" from
the other nodes would race torchrun's store. Instead the head node's preflight itself listens on
that very port, for at most `--timeout` seconds, and is the meeting point:

    node 0: bind :29500 (fails at once if the port is taken) → accept…
    node 1: connect 10.0.0.1:29500 (retrying until the deadline) ← greeting "MNCLOUD-PREFLIGHT 1"
    node 1: → hello {rank, nodes, host, code_hash, gpus, failures}
    node 0: all N-1 hellos in (or the deadline) → close the listening port → one verdict:
            every failure of any node, or OK → to every node; each node closes first, so the
            TIME_WAITs sit on its side and torchrun on node 0 can bind 29500 again at once
    all:    OK → torchrun; FAIL → print "preflight failed on node R: <cause>", exit 78
            (75 when every cause is the bucket not answering: a storage outage, retried
            apart from --max-restarts; `checks.outage_only`)

This proves exactly the path torchrun needs (node → master:port), needs no bucket, and stops
every node with the same one line. A node that cannot connect by the deadline fails itself
("cannot reach the master …"); the head names every node that never checked in. A node that
connects and gets no greeting has found a running job's store there (a single relaunched node
rejoining): it passes without the gang part. Nodes start `run` together (SkyPilot gang-
schedules it after setup everywhere), so the default 60 s deadline is generous.

The code hash covers source-like files only (`*.py`, configs, shell, requirements — see
`CODE_SUFFIXES`), not data, logs or checkpoints a previous attempt left in the workdir.

    checks.py     the single checks (laptop and node): code hash, GPUs, paths, bucket
    gang.py       the gang check above
    node.py       every check of one node, then the gang check (`python -m mncloud.doctor node`,
                  through `__main__.py`)
    bandwidth.py  the all-reduce bandwidth test after the gang check
    meeting.py    where a cloud job group's nodes meet for it (node 0's address in the bucket)
    mesh.py       a sharded run's mesh against the nodes × GPUs it was given
    trackers.py   a tracker the run asks for (MLflow, W&B) whose package the node lacks

No torch or SkyPilot at import; the node entry point uses argparse, not the CLI.
"""

from mncloud.doctor.checks import (
    PREFLIGHT_FAILED_EXIT_CODE,
    Check,
    check_bucket,
    check_code_hash,
    check_credentials,
    check_gpus,
    check_ifname,
    check_launcher,
    check_path,
    code_hash,
    failures,
    interfaces,
)
from mncloud.doctor.node import main, node_main

__all__ = [
    "PREFLIGHT_FAILED_EXIT_CODE",
    "Check",
    "check_bucket",
    "check_code_hash",
    "check_credentials",
    "check_gpus",
    "check_ifname",
    "check_launcher",
    "check_path",
    "code_hash",
    "failures",
    "interfaces",
    "main",
    "node_main",
]
