"""`python -m mncloud.doctor node`: every check of one node, then the gang check, before
the launcher starts."""

from __future__ import annotations

import argparse
import os
import socket
import sys
import time
from typing import TYPE_CHECKING

from mncloud import constants
from mncloud.doctor import bandwidth
from mncloud.doctor.checks import (
    DEFAULT_TIMEOUT,
    PREFLIGHT_FAILED_EXIT_CODE,
    Check,
    check_bucket,
    check_code_hash,
    check_gpus,
    check_ifname,
    check_launcher,
    check_path,
    check_resolvable,
    code_hash,
    count_gpus,
    failures,
    outage_only,
    storage_failure,
)
from mncloud.doctor.gang import NodeInfo, run_head, run_member
from mncloud.doctor.mesh import mesh_warnings
from mncloud.doctor.trackers import tracker_warnings

if TYPE_CHECKING:
    from mncloud.doctor.meeting import Place
    from mncloud.storage.checkpoints import CheckpointStore

# --------------------------------------------------------------------------- the node command


def node_checks(args: argparse.Namespace, rank: int) -> tuple[list[Check], str, int | None]:
    """This node's own checks, its code hash and its GPU count."""
    checks = [check_gpus(args.expect_gpus, rank)]
    gpus = None
    if args.expect_gpus > 0:
        gpus, _ = count_gpus()
    checks += [check_path(p, rank) for p in args.require_path]
    checks.append(check_ifname(os.environ.get("NCCL_SOCKET_IFNAME"), rank))
    checks.append(check_launcher(args.launcher, rank))
    digest = code_hash(args.workdir)
    checks.append(check_code_hash(digest, args.code_hash, rank))
    if args.bucket:
        checks.append(check_bucket(args.bucket, rank))
    return checks, digest, gpus


def node_main(argv: list[str] | None = None) -> int:
    """`python -m mncloud.doctor node …`: this node's checks, then the gang check."""
    parser = argparse.ArgumentParser(prog="python -m mncloud.doctor node")
    parser.add_argument("--expect-gpus", type=int, default=0, help="GPUs per node; 0 = CPU")
    parser.add_argument("--port", type=int, default=None, help="rendezvous port (MASTER_PORT)")
    parser.add_argument("--require-path", action="append", default=[], help="must exist")
    parser.add_argument("--code-hash", default=None, help="expected workdir code hash")
    parser.add_argument("--bucket", default=None, help="check this bucket is writable")
    parser.add_argument("--workdir", default=".", help="the synced workdir")
    parser.add_argument("--launcher", default=None, help="must be on PATH (e.g. accelerate)")
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT)
    parser.add_argument("--bandwidth", action="store_true", help="all-reduce test (2+ nodes)")
    parser.add_argument("--expect-busbw", type=float, default=None, help="GB/s the plan expects")
    parser.add_argument("--fabric", default=None, help="the offer's fabric, for the messages")
    parser.add_argument("--min-bandwidth", type=float, default=None, help="GB/s, else refuse")
    parser.add_argument(
        "--meet-nodes", type=int, default=0, help="a job group's node count: meet in the bucket"
    )
    parser.add_argument("--meet-timeout", type=float, default=None, help="seconds (900)")
    args = parser.parse_args(argv)
    start = time.monotonic()
    rank = int(os.environ.get(constants.SKYPILOT_NODE_RANK, "0") or 0)
    nodes = int(os.environ.get(constants.SKYPILOT_NUM_NODES, "1") or 1)
    ips = os.environ.get(constants.SKYPILOT_NODE_IPS, "127.0.0.1").split()
    master = os.environ.get("MASTER_ADDR") or (ips[0] if ips else "127.0.0.1")
    port = args.port or int(os.environ.get("MASTER_PORT") or constants.DEFAULT_MASTER_PORT)
    place = None
    if args.meet_nodes > 1:  # a job group's node: its rank, the gang and node 0 from the bucket
        place = meet(args, master, port)
        if isinstance(place, list):
            return _refuse(place)
        rank, nodes, master, port = place.rank, place.nodes, place.master, place.port
    checks, digest, gpus = node_checks(args, rank)
    if nodes > 1:
        checks.append(check_resolvable(master, rank))
    own = NodeInfo(
        rank=rank,
        nodes=nodes,
        host=socket.gethostname(),
        code_hash=digest,
        gpus=gpus,
        failures=[c.detail for c in failures(checks)],
    )
    note = ""
    if nodes <= 1:
        problems = [c.line() for c in failures(checks)]
    elif rank == 0:
        problems = run_head(own, port, args.timeout)
    else:
        problems, note = run_member(own, master, port, args.timeout)
        if not problems and own.failures:  # joined a running job: own failures still count
            problems = [c.line() for c in failures(checks)]
    if not problems and nodes > 1 and args.bandwidth and not note.startswith("the master port"):
        problems = bandwidth_test(args, rank, nodes, master, port)
    if place is not None and rank == 0 and nodes > 1:
        close_meeting(args, problems)
    note = place.note if place is not None and place.note else note
    took = time.monotonic() - start
    if rank == 0 and not problems:
        per_node = int(os.environ.get(constants.SKYPILOT_NUM_GPUS_PER_NODE) or 0)
        parallel = os.environ.get(constants.PARALLEL_ENV)
        for line in mesh_warnings(args.bucket, nodes, per_node, parallel):
            print(line, file=sys.stderr, flush=True)
    if not problems:  # each node: each has its own packages
        for line in tracker_warnings(os.environ, rank):
            print(line, file=sys.stderr, flush=True)
    if problems:
        return _refuse(problems)
    print(
        f"preflight ok on node {rank}/{nodes} in {took:.1f}s: code {digest}"
        + (f", {gpus} GPU(s)" if gpus is not None else "")
        + (f"; {note}" if note else ""),
        file=sys.stderr,
        flush=True,
    )
    return 0


def _refuse(problems: list[str]) -> int:
    """Print the failures; exit 78, or 75 when the storage did not answer and nothing else
    failed (a storage outage: retried without spending --max-restarts)."""
    for line in problems:
        print(line, file=sys.stderr, flush=True)
    if outage_only(problems):
        return constants.STORAGE_OUTAGE_EXIT_CODE
    return PREFLIGHT_FAILED_EXIT_CODE


def _meeting_store(args: argparse.Namespace) -> tuple[CheckpointStore, str]:
    from mncloud.doctor import meeting
    from mncloud.storage.checkpoints import CheckpointStore

    launch = meeting.launch_id()
    if not args.bucket or not launch:
        raise ValueError(
            f"the job group's preflight meets in the bucket: set {constants.CKPT_URI_ENV} "
            f"(--bucket) and {constants.RUN_ID_ENV} (or SkyPilot's {meeting.MANAGED_JOB_ID_ENV})"
        )
    return CheckpointStore(args.bucket, retry_seconds=30.0), launch


def meet(args: argparse.Namespace, address: str, port: int) -> Place | list[str]:
    """A job group's node (`--meet-nodes N`): where it meets the others (`doctor/meeting.py`),
    or its failure lines. Node 0 waits `--meet-timeout` for the others: they start minutes apart."""
    from mncloud.doctor import meeting

    rank = int(os.environ.get(constants.REPLICA_ID_ENV, "0") or 0)
    wait = args.meet_timeout or meeting.MEET_TIMEOUT_S
    try:
        store, launch = _meeting_store(args)
        place = meeting.join(store, launch, rank, args.meet_nodes, address, port, wait)
    except Exception as err:  # one line: a bucket error or no meeting in time
        text = storage_failure("", err).removeprefix(": ")
        return [
            text
            if text.startswith("preflight failed")
            else f"preflight failed on node {rank}: {text}"
        ]
    if place.refused:
        return [
            *place.refused,
            f"preflight failed on node {rank}: this launch's gang failed its "
            "preflight (above); fix it and launch again",
        ]
    if rank == 0 and place.nodes > 1:
        args.timeout = max(args.timeout, wait)  # the gang check waits for them all
    return place


def close_meeting(args: argparse.Namespace, problems: list[str]) -> None:
    """Node 0 of a job group: the verdict beside the meeting point (a bucket hiccup is said)."""
    from mncloud.doctor import meeting

    try:
        store, launch = _meeting_store(args)
        meeting.close(store, launch, problems)
    except Exception as err:
        print(f"preflight: the verdict was not published ({err})", file=sys.stderr, flush=True)


def bandwidth_test(
    args: argparse.Namespace, rank: int, nodes: int, master: str, port: int
) -> list[str]:
    """The all-reduce bandwidth test (`doctor/bandwidth.py`) once the gang agreed: its
    failures, one line each; its figure (and a warning) printed, published by node 0."""
    known = bandwidth.known_figure(os.environ.get(constants.BANDWIDTH_KNOWN_ENV), nodes)
    if known is not None:  # a local relaunch on nodes that all predate the figure
        known.expected_gbs, known.fabric = args.expect_busbw, args.fabric
        problems, warnings = bandwidth.judge(known, args.min_bandwidth)
        ago = f" (measured {max(0.0, time.time() - known.at):.0f}s ago on these nodes, reused)"
        for line in warnings or ([] if problems else [f"preflight: {known.line()}"]):
            print(line + ago, file=sys.stderr, flush=True)
        return [line + ago for line in problems]
    try:
        result = bandwidth.measure(rank, nodes, master, port, args.timeout)
    except ImportError:
        print("preflight: bandwidth test skipped (torch is not installed)", file=sys.stderr)
        return []
    except Exception as err:  # torch raises RuntimeError and its own DistError types
        return [
            f"preflight failed on node {rank}: the all-reduce bandwidth test could not run "
            f"({' '.join(str(err).split())[:200]}); a node unreachable from {master}:{port} "
            "or a firewall between the nodes"
        ]
    result.expected_gbs, result.fabric = args.expect_busbw, args.fabric
    result.run_id = os.environ.get(constants.RUN_ID_ENV)
    problems, warnings = bandwidth.judge(result, args.min_bandwidth)
    for line in warnings or ([] if problems else [f"preflight: {result.line()}"]):
        print(line, file=sys.stderr, flush=True)
    if rank == 0:
        try:
            bandwidth.publish(result, args.bucket)
        except Exception as err:  # the figure is for status: a bucket hiccup never stops a run
            print(f"preflight: bandwidth figure not published ({err})", file=sys.stderr)
    return problems


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] != "node":
        print("usage: python -m mncloud.doctor node [options]  (laptop: mncloud doctor)")
        return 2
    return node_main(argv[1:])
