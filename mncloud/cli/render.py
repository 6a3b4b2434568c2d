"""`mncloud render`: print the SkyPilot task YAML for a training script."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from mncloud.cli import options as opts
from mncloud.cli._common import console, handle_errors, print_json
from mncloud.cli.params import ESSENTIALS


def register(app: typer.Typer) -> None:
    """Add `render` to the app."""
    app.command("render")(render_command)


@opts.command(opts.SCRIPT, opts.MARKET, opts.JOB, opts.PLANNING)
@handle_errors
def render_command(
    output: Annotated[
        Path | None,
        typer.Option(
            "-o", "--output", rich_help_panel=ESSENTIALS, help="Write the YAML to this file."
        ),
    ] = None,
    as_json: opts.Json = False,
    with_plan: Annotated[
        bool,
        typer.Option(
            "--plan",
            rich_help_panel=ESSENTIALS,
            help="Plan first; the winner and its fallbacks become `ordered` resources.",
        ),
    ] = False,
    **values: Any,
) -> None:
    """Print the SkyPilot task YAML for SCRIPT, validated by SkyPilot's own schema."""
    from mncloud import catalog as catalog_mod

    catalog_mod.use_catalog_dir(values["catalog"])
    from mncloud.launch import prepare
    from mncloud.render import render

    notices: list[str] = []  # no cloud enabled: rendered for this machine, and said so
    spec = opts.spec_from_options(values, notices=notices)
    launch_options = opts.launch_options_from(values)
    if with_plan:
        task = prepare(spec, launch_options).task
    else:
        task = render(spec, template=launch_options.template)
    opts.print_notices(notices)
    text = task.to_json() + "\n" if as_json else task.yaml_text
    if output is not None:
        try:
            output.write_text(text)
        except OSError as err:  # a folder, a missing parent, a name too long
            message = f"--output {str(output)!r}: cannot write it ({err.strerror})"
            raise opts.SpecError(message) from None
        console.print(f"wrote {output}", highlight=False, soft_wrap=True)
    elif as_json:
        print_json(list(task.documents) or task.config)  # a job group: every document
    else:
        typer.echo(text, nl=False)
