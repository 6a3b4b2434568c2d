"""`mncloud ckpt`: placeholder until the checkpoint commands land (helper writes this file)."""

from __future__ import annotations

import typer

app = typer.Typer(no_args_is_help=True)
