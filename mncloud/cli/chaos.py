"""`mncloud chaos preempt|storage-outage`: break a local run on purpose, as the cloud would.

    mncloud chaos preempt demo --node 1              # SIGKILL node 1, like a spot VM vanishing
    mncloud chaos preempt demo --every 20s --times 3 # three preemptions, 20 s apart
    mncloud chaos preempt demo --during-save         # kill while a checkpoint is being written
    mncloud chaos preempt demo --notice 30s --cloud-protocol gcp
                                 # the spot notice first (node 1's GCP metadata says preempted),
                                 # the kill 30 s later if the node has not stopped by then
    mncloud chaos storage-outage demo --seconds 30   # the bucket is unreachable for 30 s

Only runs of `--cloud local`; the supervisor notices the lost node and recovers. An outage
stopped early (Ctrl-C, SIGTERM or SIGHUP) ends at once: the bucket is reachable again.
"""

from __future__ import annotations

import contextlib
import math
import random
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated

import typer

from mncloud.cli._common import Signalled, console, handle_errors, print_json, signals_interrupt
from mncloud.cli.options import parse_duration
from mncloud.errors import BackendError, SpecError

app = typer.Typer(
    no_args_is_help=True, help="Preempt nodes or take the bucket away from a local run."
)

NameArg = Annotated[str, typer.Argument(help="The name of a local run (mncloud up --cloud local).")]


def _local_folder(name: str) -> Path:
    from mncloud.backends.registry import backend_name_of
    from mncloud.layout import run_dir

    if backend_name_of(name) != "local":
        raise BackendError(f"run {name!r} is not local; chaos works on --cloud local runs only")
    return run_dir(name)


@app.command("preempt")
@handle_errors
def preempt_command(
    name: NameArg,
    node: Annotated[
        int | None, typer.Option("--node", help="The node to preempt (default: a random one).")
    ] = None,
    every: Annotated[
        str | None, typer.Option("--every", help="Preempt repeatedly, this long apart (20s, 2m).")
    ] = None,
    times: Annotated[
        int | None,
        typer.Option(
            "--times",
            min=1,
            help="How many preemptions (default 1; with --every: until the run ends).",
        ),
    ] = None,
    during_save: Annotated[
        bool,
        typer.Option(
            "--during-save",
            help="Wait for a checkpoint write (mncloud's, or a --ckpt-dir folder not yet "
            "committed), kill during it.",
        ),
    ] = False,
    notice: Annotated[
        str | None,
        typer.Option(
            "--notice",
            help="Warn first through the node's metadata (30s, 2m); kill when the time is up.",
        ),
    ] = None,
    cloud_protocol: Annotated[
        str,
        typer.Option("--cloud-protocol", help="Metadata protocol of the notice: aws, gcp, azure."),
    ] = "gcp",
    as_json: Annotated[bool, typer.Option("--json", help="Print each preemption as JSON.")] = False,
) -> None:
    """SIGKILL a node's launcher, torchrun and workers, like a spot VM vanishing."""
    from mncloud.backends.local.chaos import notify_node, preempt_node
    from mncloud.backends.local.state import load_state

    interval = parse_duration(every, "--every", positive=True)
    notice_s = parse_duration(notice, "--notice")
    folder = _local_folder(name)
    state = load_state(folder)
    if node is not None and not 0 <= node < state.num_nodes:
        raise BackendError(f"--node {node}: run {name} has nodes 0..{state.num_nodes - 1}")
    count = times or (1 if interval is None else 1_000_000)
    records = []
    try:
        for num_nodes in _rounds(folder, name, count, interval):
            target = node if node is not None else random.randrange(num_nodes)
            if notice_s is not None:
                record = notify_node(
                    folder, target, notice_s, protocol=cloud_protocol, during_save=during_save
                )
            else:
                record = preempt_node(folder, target, during_save=during_save)
            records.append(record)
            if not as_json:
                pids = record.get("pids")
                line = record["message"] + (f": killed pids {pids}" if pids else "")
                console.print(line, markup=False, highlight=False, soft_wrap=True)
    except KeyboardInterrupt:
        raise typer.Exit(code=130) from None
    if as_json:
        print_json(records)


def _rounds(folder: Path, name: str, count: int, interval: float | None) -> Iterator[int]:
    """Up to `count` times, `interval` apart, once the run is RUNNING: yield its node count.
    Stops when the run ends (BackendError if it ended before the first round)."""
    from mncloud.backends.local.lifecycle import wait_for_running
    from mncloud.backends.local.state import load_state

    for i in range(count):
        if interval is not None:
            deadline = time.monotonic() + interval
            while time.monotonic() < deadline and not load_state(folder).state.is_final:
                time.sleep(min(0.5, max(0.0, deadline - time.monotonic())))
        state = wait_for_running(folder)
        if state.state.is_final:
            if i == 0:
                raise BackendError(f"run {name} is {state.state.value}; nothing to preempt")
            return
        yield state.num_nodes


@app.command("storage-outage")
@handle_errors
def storage_outage_command(
    name: NameArg,
    seconds: Annotated[
        float,
        typer.Option(
            "--seconds", min=0.1, max=86400.0, help="How long the bucket stays unreachable."
        ),
    ] = 30.0,
) -> None:
    """Make the run's bucket unreachable for a while (file:// or a storage server on this host)."""
    from mncloud.backends.local.chaos import storage_outage

    if not math.isfinite(seconds):
        raise SpecError(f"--seconds {seconds:g}: give a number of seconds, e.g. 30")
    folder = _local_folder(name)
    try:
        with signals_interrupt(), contextlib.closing(storage_outage(folder, seconds)) as lines:
            for message in lines:
                console.print(message, soft_wrap=True)
    except Signalled as stop:
        raise typer.Exit(code=128 + stop.signum) from None
    except KeyboardInterrupt:
        raise typer.Exit(code=130) from None
