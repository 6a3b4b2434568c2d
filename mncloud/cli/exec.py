"""`mncloud exec NAME [SCRIPT] [-- ARGS]`: the run's task again on the nodes it still holds."""

from __future__ import annotations

from typing import Any

import typer
from rich.markup import escape

from mncloud.cli import options as opts
from mncloud.cli._common import console, handle_errors, print_json


def register(app: typer.Typer) -> None:
    """Add `exec` to the app."""
    app.command("exec")(exec_command)


@opts.command(opts.EXEC)
@handle_errors
def exec_command(**values: Any) -> None:
    """Run NAME's task again on its live cluster (`up --cluster`) or its local nodes: the
    workdir synced, no provisioning, no setup, torchrun across the same nodes. It resumes
    from the newest complete checkpoint (--restart: from step 0). `mncloud down NAME` ends it.
    """
    from mncloud.backends.base import RunState
    from mncloud.launch import exec_run

    launched = exec_run(
        values["name"], values["script"], values["script_args"], restart=values["restart"]
    )
    status = launched.status
    if not values["detach"] and not values["as_json"]:
        from mncloud.cli.up import follow

        status = follow(launched.prepared.backend, status.name)
    if values["as_json"]:
        print_json(status.model_dump(mode="json"))
    else:
        console.print(
            f"[bold]{status.name}[/]: {escape(status.detail or status.state.value.lower())}",
            soft_wrap=True,
        )
    if status.state is RunState.FAILED:
        raise typer.Exit(code=1)
