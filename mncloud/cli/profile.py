"""`mncloud profile SCRIPT [-- ARGS]`: what one step of the script costs, for `plan --steps`."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from mncloud.cli import options as opts
from mncloud.cli._common import console, handle_errors, print_json


def register(app: typer.Typer) -> None:
    """Add `profile` to the app."""
    app.command("profile")(profile_command)


@handle_errors
def profile_command(
    script: opts.Script,
    script_args: opts.ScriptArgs = None,
    meta: Annotated[
        bool,
        typer.Option(
            "--meta",
            help="Count from shapes only (parameters become fake tensors): a model larger than "
            "this machine's memory; nothing is timed.",
        ),
    ] = False,
    gpus_per_node: Annotated[
        int,
        typer.Option(
            "--gpus-per-node",
            min=1,
            help="GPUs per node of the run to size: a sharded script's state is divided over "
            "them (hsdp) or over every GPU of the run (fsdp).",
        ),
    ] = 8,
    nodes: Annotated[int, typer.Option("--nodes", min=1, help="Nodes of the run to size.")] = 1,
    as_json: opts.Json = False,
) -> None:
    """Run a few steps of the script in one process here, count one step's FLOPs, operators,
    gradient, optimizer and activation bytes, time the others, and keep the profile for
    `plan SCRIPT --steps N` and `up` (the script's loop must pass through mncloud.train:
    `Replicas.steps` or `CheckpointManager.maybe_save`)."""
    from mncloud.plan.profile import run_profile, save

    args = list(script_args or [])
    profile = run_profile(Path(script), args, meta=meta)
    path = save(profile)
    memory, how = profile.memory_per_gpu(gpus_per_node=gpus_per_node, nodes=nodes)
    if as_json:
        sized = {"memory_per_gpu_bytes": memory, "memory_per_gpu": how}
        print_json(profile.model_dump(mode="json") | sized | {"path": str(path)})
        return
    gib = 2**30
    console.print(
        f"{Path(profile.script).name}: {profile.flops_per_step:.3g} FLOPs per step per GPU, "
        f"{profile.ops_per_step:,} operators; {profile.params:,} parameters (weights "
        f"{profile.weight_bytes / gib:,.3g} GiB, gradients {profile.grad_bytes / gib:,.3g} GiB, "
        f"optimizer {profile.optimizer_bytes / gib:,.3g} GiB, activations "
        f"{profile.activation_bytes / gib:,.3g} GiB "
        f"{'measured' if profile.activations_measured else 'counted'})",
        highlight=False,
    )
    console.print(
        f"memory per GPU on {nodes} node(s) × {gpus_per_node} GPUs: {memory / gib:,.3g} GiB "
        f"({how})",
        highlight=False,
    )
    if profile.samples_per_step:
        tokens = f", {profile.tokens_per_step:,} tokens" if profile.tokens_per_step else ""
        console.print(f"batch: {profile.samples_per_step:,} samples{tokens}", highlight=False)
    if profile.step_seconds is not None:
        line = f"step: {profile.step_seconds * 1000:,.2f} ms on {profile.device}"
        mfu = profile.measured_mfu
        if mfu is not None:
            line += f", MFU {mfu:.1%} of its bf16 peak"
        elif profile.device_matmul_flops:
            achieved = profile.flops_per_step / profile.step_seconds
            line += f" ({achieved / profile.device_matmul_flops:.1%} of its measured matmul rate)"
        console.print(line, highlight=False)
    console.print(
        f"kept in {path}; next: mncloud plan {script} --gpus H100:8,A100-80GB:8 --steps N",
        style="dim",
        highlight=False,
        soft_wrap=True,
    )
