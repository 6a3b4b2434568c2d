"""`mncloud ui`: serve a local, read-only web view of runs (`mncloud.ui`)."""

from __future__ import annotations

from typing import Annotated

import typer

from mncloud.cli._common import console, handle_errors

HostOpt = Annotated[
    str,
    typer.Option(
        "--host",
        help="The IP address to listen on. Anything but loopback (127.0.0.1, ::1) needs a "
        "token: --token, or one generated and printed once.",
    ),
]
PortOpt = Annotated[int, typer.Option("--port", help="The port to listen on.")]
TokenOpt = Annotated[
    str | None,
    typer.Option(
        "--token",
        help="A token every request must carry (?token=… once, then a cookie); 16+ "
        "characters. Generated when --host is not loopback.",
    ),
]
CheckOpt = Annotated[
    bool, typer.Option("--check", hidden=True, help="Check the options, build the app, exit.")
]


def register(app: typer.Typer) -> None:
    """Add `ui` to the app."""
    app.command("ui")(ui_command)


@handle_errors
def ui_command(
    port: PortOpt = 8765,
    host: HostOpt = "127.0.0.1",
    token: TokenOpt = None,
    check: CheckOpt = False,
) -> None:
    """Serve a web view of the runs on this machine: a runs table, and per run a timeline,
    the goodput breakdown, checkpoints, the run record and logs that follow the run.
    Read-only; Ctrl-C stops it."""
    from mncloud.ui.serve import binding, check_port, require_extra, serve

    bound = binding(host, port, token)
    require_extra()
    if check:
        from mncloud.ui.app import create_app

        create_app(token=bound.token)
        console.print(f"ok: would serve {bound.url}", markup=False, highlight=False, soft_wrap=True)
        return
    check_port(bound.host, bound.port)
    if bound.generated:
        console.print(
            f"--host {bound.host} is reachable from other machines: every request needs this "
            f"token (shown once): {bound.token}",
            markup=False,
            highlight=False,
            soft_wrap=True,
        )
    console.print(
        f"serving {bound.url} (Ctrl-C stops it)", markup=False, highlight=False, soft_wrap=True
    )
    serve(bound)
