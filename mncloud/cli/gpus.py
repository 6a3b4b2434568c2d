"""`mncloud gpus [NAME]`: the accelerator names `--gpus` takes, with counts, clouds and prices."""

from __future__ import annotations

from typing import Annotated

import typer
from rich import box
from rich.table import Table

from mncloud.cli._common import console, handle_errors, print_json


def register(app: typer.Typer) -> None:
    """Add `gpus` to the app."""
    app.command("gpus")(gpus_command)


def _money(value: float | None, cloud: str | None) -> str:
    return "-" if value is None else f"${value:,.2f} {cloud}"


@handle_errors
def gpus_command(
    name: Annotated[
        str | None,
        typer.Argument(help="Only accelerators whose name contains this (e.g. H100, a100)."),
    ] = None,
    cloud: Annotated[
        list[str] | None,
        typer.Option("--cloud", help="Only this cloud (repeatable); default: those plan searches."),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """List the accelerators --gpus takes (NAME:COUNT per node), the clouds that offer each,
    and the cheapest on-demand and spot price of one node, from SkyPilot's catalog."""
    from mncloud.catalog import use_catalog_dir
    from mncloud.catalog.gpus import list_gpus
    from mncloud.errors import SpecError
    from mncloud.spec import LOCAL_CLOUD, canonical_cloud

    use_catalog_dir()  # before SkyPilot is imported (the cloud names below may import it)
    clouds = []
    for value in cloud or []:
        try:
            clouds.append(canonical_cloud(value))
        except ValueError as err:
            raise SpecError(str(err)) from None
    if LOCAL_CLOUD in clouds:
        raise SpecError("--cloud local has no GPUs: local nodes take --gpus cpu:N")
    listings = list_gpus(name, clouds)
    if as_json:
        print_json([g.model_dump(mode="json") for g in listings])
        return
    table = Table(
        title="accelerators (--gpus NAME:COUNT)", title_justify="left", box=box.SIMPLE_HEAD
    )
    for column in ("--gpus", "clouds", "on-demand $/h node", "spot $/h node"):
        table.add_column(column, justify="right" if "$" in column else "left")
    for g in listings:
        table.add_row(
            f"{g.accelerator}:{g.count}",
            ", ".join(g.clouds),
            _money(g.on_demand, g.on_demand_cloud),
            _money(g.spot, g.spot_cloud),
        )
    console.print(table)
    console.print("$/h of one node, cheapest region; `mncloud plan` ranks a job's offers")
