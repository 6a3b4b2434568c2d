"""`python -m mncloud.train.lighthouse serve|find`: torchft's lighthouse on a cloud, and how
the nodes find it (the address in the bucket: `mncloud/storage/lighthouse.py`).

- `serve` (the job group's lighthouse task): runs `torchft_lighthouse` and, while it lives,
  publishes `http://<this VM's private address>:<port>` every `REFRESH_S`; exits with the
  lighthouse's status (0 once SIGTERM, which it passes on, stopped it: no error to retry).
- `find` (each node task, before torchrun): waits until the live lighthouse of this launch
  has published its address and prints it (the node exports it as `TORCHFT_LIGHTHOUSE`).
  One line and exit 2 when none appears within `--timeout`.

Both read the run's checkpoint URI and run id from the task's environment
(`MNCLOUD_CKPT_URI`, `MNCLOUD_RUN_ID`). The nodes reach the private address because SkyPilot
places the whole group in one cloud and region (its common-infrastructure search) and lets
its own VMs talk to each other there: on AWS its clusters share one security group that
admits all traffic from itself, on GCP its network admits internal traffic.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import time

from mncloud import constants
from mncloud.storage.checkpoints import CheckpointStore
from mncloud.storage.lighthouse import REFRESH_S, publish_address, read_address

FIND_POLL_S = 2.0
FIND_TIMEOUT_S = 900.0
"""How long a node waits for the lighthouse: its VM's provisioning and setup."""


def own_address() -> str:
    """This VM's private address: SkyPilot's first node IP, else what the hostname resolves to."""
    ips = os.environ.get("SKYPILOT_NODE_IPS", "").split()
    if ips:
        return ips[0]
    return socket.gethostbyname(socket.gethostname())


def _store() -> CheckpointStore:
    uri = os.environ.get(constants.CKPT_URI_ENV)
    if not uri:
        raise SystemExit(
            f"mncloud lighthouse: {constants.CKPT_URI_ENV} is not set; the run needs --bucket"
        )
    return CheckpointStore(uri, retry_seconds=30.0)


def serve(args: argparse.Namespace) -> int:
    """Run the lighthouse; publish its address while it runs."""
    store = _store()
    run_id = os.environ.get(constants.RUN_ID_ENV) or None
    command = [
        args.lighthouse_bin,
        "--min_replicas", str(args.min_replicas),
        "--bind", f"[::]:{args.port}",
        "--heartbeat_timeout_ms", str(args.heartbeat_timeout_ms),
        "--join_timeout_ms", str(args.join_timeout_ms),
    ]  # fmt: skip
    child = subprocess.Popen(command)
    stopped: list[bool] = []

    def stop(*_: object) -> None:  # SkyPilot ends the task: end the lighthouse with it
        stopped.append(True)
        child.terminate()

    signal.signal(signal.SIGTERM, stop)
    url = f"http://{own_address()}:{args.port}"
    while child.poll() is None:
        try:
            publish_address(store, url, run_id)
        except Exception as err:  # the bucket may be unreachable a while: try again
            print(f"mncloud lighthouse: cannot publish {url} yet: {err}", file=sys.stderr)
        deadline = time.monotonic() + REFRESH_S
        while child.poll() is None and time.monotonic() < deadline:
            time.sleep(0.5)
    return 0 if stopped else child.returncode  # told to stop is no error to retry


def find(args: argparse.Namespace) -> int:
    """Print the live lighthouse's URL once it is published (exit 2 on timeout)."""
    store = _store()
    run_id = os.environ.get(constants.RUN_ID_ENV) or None
    deadline = time.monotonic() + args.timeout
    while True:
        try:
            address = read_address(store, run_id)
        except Exception:  # unreachable for now: the deadline bounds the wait
            address = None
        if address is not None:
            print(address.url)
            return 0
        if time.monotonic() >= deadline:
            print(
                f"mncloud lighthouse: no live lighthouse published its address under "
                f"{os.environ.get(constants.CKPT_URI_ENV)} within {args.timeout:g} s; see the "
                "lighthouse task's logs (`mncloud logs RUN`)",
                file=sys.stderr,
            )
            return 2
        time.sleep(FIND_POLL_S)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mncloud.train.lighthouse")
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("serve", help="run torchft's lighthouse and publish its address")
    run.add_argument("--port", type=int, required=True)
    run.add_argument("--min-replicas", type=int, required=True)
    run.add_argument("--heartbeat-timeout-ms", type=int, required=True)
    run.add_argument("--join-timeout-ms", type=int, required=True)
    run.add_argument("--lighthouse-bin", default="torchft_lighthouse")
    look = sub.add_parser("find", help="print the live lighthouse's URL")
    look.add_argument("--timeout", type=float, default=FIND_TIMEOUT_S)
    args = parser.parse_args(argv)
    return serve(args) if args.command == "serve" else find(args)


if __name__ == "__main__":
    sys.exit(main())
