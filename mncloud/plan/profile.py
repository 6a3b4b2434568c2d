"""A training script's profile: what one step costs, measured once, kept by script version.

`run_profile` runs the script in one process on this machine (`mncloud.train.profiler`: a few
timed steps, one counted step, then the script is stopped) and returns a `StepProfile`;
`save` keeps it under `$MNCLOUD_HOME/profiles/`, keyed by the script's content and arguments,
and `find` answers `plan SCRIPT` / `up SCRIPT` with the newest profile of that script and
arguments: fresh (same content), stale (the script changed since) or missing.

A script that does not import mncloud, or a plan without a script, describes its step by
flags instead (`workload_from_flags`: parameters and FLOPs or tokens per step).
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from enum import Enum
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from mncloud import layout
from mncloud.constants import CKPT_DIR_ENV, CKPT_URI_ENV, PROFILE_META_ENV, PROFILE_OUT_ENV
from mncloud.errors import SpecError
from mncloud.plan import hardware
from mncloud.plan.stepmodel import Workload, attention_flops_per_token, measured_mfu
from mncloud.spec.launch import PlanOptions

#: The longest a profile run may take: a few steps of a script (the import of torch included).
PROFILE_TIMEOUT_S = 900.0
#: Variables of a launcher that would make the profiled script wait for peers.
_LAUNCHER_VARS = (
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "TORCHELASTIC_RUN_ID",
    "MNCLOUD_RUN_ID",
    "MNCLOUD_RECOVERY",
)


class ProfileError(SpecError):
    """The profile run failed, or a profile is missing or stale where one is needed."""


class Freshness(str, Enum):
    FRESH = "fresh"
    STALE = "stale"
    MISSING = "missing"


class StepProfile(BaseModel):
    """One step of a script, counted and (unless `meta`) timed on this machine."""

    model_config = ConfigDict(frozen=True, allow_inf_nan=False)

    script: str
    args: list[str] = Field(default_factory=list)
    script_sha256: str
    created: float
    flops_per_step: float = Field(gt=0)
    ops_per_step: int = 0
    params: int = 0
    weight_bytes: int = 0
    grad_bytes: int = 0
    optimizer_bytes: int = 0
    activation_bytes: int = 0
    activations_measured: bool = False
    """True on a GPU (peak memory); on CPU the tensors saved for backward are counted."""
    peak_memory_bytes: int | None = None
    samples_per_step: int | None = None
    tokens_per_step: int | None = None
    step_seconds: float | None = None
    """Median measured step on `device` (None under `meta`)."""
    steps_timed: int = 0
    device: str = "cpu"
    device_matmul_flops: float | None = None
    """This device's measured matmul FLOP/s: MFU's denominator where no datasheet has one."""
    meta: bool = False
    torch: str = ""
    shapes: dict[str, list[int]] = Field(default_factory=dict)
    """The models' tensors by name and shape (what `up --resume` compares with a checkpoint)."""
    parallel: str | None = None
    """How the script spreads its model (`mncloud.train.parallelize`: ddp, fsdp or hsdp);
    None when it did not say (a replica per GPU is assumed)."""

    @property
    def gpu(self) -> hardware.GpuFacts | None:
        """The data file's GPU this profile ran on, or None (a CPU, an unknown GPU)."""
        return hardware.gpu_for_device(self.device)

    @property
    def measured_mfu(self) -> float | None:
        """The efficiency the measured step implies on a known GPU (None on CPU)."""
        gpu = self.gpu
        if gpu is None or self.step_seconds is None:
            return None
        return measured_mfu(
            self.flops_per_step, self.ops_per_step, self.step_seconds, gpu.peak_flops()
        )

    def memory_per_gpu(self, *, gpus_per_node: int, nodes: int) -> tuple[float, str]:
        """Bytes one GPU holds in a run of `nodes` × `gpus_per_node` GPUs, and how: a sharded
        script's weights, gradients and optimizer state ÷ its shard group (every GPU for fsdp,
        a node's for hsdp), plus the activations; a replica per GPU otherwise."""
        from mncloud.plan.sharding import memory_per_gpu
        from mncloud.spec import Parallel

        parallel = Parallel(self.parallel) if self.parallel else Parallel.DDP
        if parallel is Parallel.HSDP and nodes < 2:
            parallel = Parallel.FSDP  # one node: nothing to replicate across
        shards = {Parallel.DDP: 1, Parallel.HSDP: gpus_per_node}.get(
            parallel, gpus_per_node * nodes
        )
        need = memory_per_gpu(self.workload(), parallel, "none", gpus_per_node=gpus_per_node,
                              nodes=nodes)  # fmt: skip
        if shards == 1:
            return need, f"{parallel.value}: a whole replica per GPU, plus activations"
        return need, (f"{parallel.value}: weights, gradients and optimizer state ÷ {shards} "
                      "GPUs, plus activations")  # fmt: skip

    def workload(self) -> Workload:
        """The step-time model's input; a GPU profile's measured efficiency replaces the
        stated default."""
        mfu = self.measured_mfu
        return Workload(
            flops_per_step=self.flops_per_step,
            ops_per_step=self.ops_per_step,
            grad_bytes=self.grad_bytes,
            weight_bytes=self.weight_bytes,
            optimizer_bytes=self.optimizer_bytes,
            activation_bytes=max(self.activation_bytes, 0),
            params=self.params,
            tokens_per_step=self.tokens_per_step or None,
            mfu=None if mfu is None else min(mfu, 1.0),
            mfu_source="" if mfu is None else f"measured on {self.device}",
        )


def _site_hook(folder: Path) -> Path:
    """A copy of mncloud's site hook in `folder` (`mncloud.train.sitehook`)."""
    hook = layout.site_hook_dir(folder)
    hook.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(layout.site_hook_source(), hook / layout.SITE_HOOK_FILE)
    return hook


def script_digest(script: Path, args: list[str]) -> str:
    """The key of a profile: the script's content and its arguments."""
    h = hashlib.sha256(script.read_bytes())
    h.update(b"\0".join(a.encode() for a in args))
    return h.hexdigest()


def run_profile(script: Path, args: list[str], *, meta: bool = False) -> StepProfile:
    """Profile `script ARGS` in one process here; ProfileError with its last error line."""
    script = script.expanduser().resolve()
    if not script.is_file():
        raise ProfileError(f"{script}: no such script; give the training script's path")
    with tempfile.TemporaryDirectory(prefix="mncloud-profile-") as tmp:
        out = Path(tmp) / "profile.json"
        env = {k: v for k, v in os.environ.items() if k not in _LAUNCHER_VARS}
        env.update({PROFILE_OUT_ENV: str(out), CKPT_URI_ENV: Path(tmp, "ckpt").as_uri()})
        # A framework's own loop (Hugging Face, Lightning) is profiled through its callback,
        # which the site hook adds; what it saves goes to a folder that ends with the profile.
        env[CKPT_DIR_ENV] = str(Path(tmp, "ckpt-dir"))
        env["PYTHONPATH"] = os.pathsep.join(
            [str(_site_hook(Path(tmp))), *filter(None, [env.get("PYTHONPATH")])]
        )
        env.pop(PROFILE_META_ENV, None)
        if meta:
            env[PROFILE_META_ENV] = "1"
        command = [sys.executable, "-m", "mncloud.train.profiler", str(script), *args]
        try:
            done = subprocess.run(
                command, env=env, capture_output=True, text=True, timeout=PROFILE_TIMEOUT_S
            )
        except subprocess.TimeoutExpired:
            raise ProfileError(
                f"profiling {script.name} took over {PROFILE_TIMEOUT_S:g} s; pass arguments "
                "that make its steps smaller, or give --flops-per-step to plan instead"
            ) from None
        if done.returncode != 0 or not out.is_file():
            lines = [line for line in done.stderr.splitlines() if line.strip()]
            last = lines[-1].strip() if lines else f"exit code {done.returncode}"
            raise ProfileError(f"profiling {script.name} failed: {last}")
        counts = json.loads(out.read_text())
    return StepProfile(
        script=str(script),
        args=list(args),
        script_sha256=hashlib.sha256(script.read_bytes()).hexdigest(),
        created=time.time(),
        **counts,
    )


def _path(profile: StepProfile) -> Path:
    return layout.profiles_dir() / f"{script_digest(Path(profile.script), profile.args)}.json"


def save(profile: StepProfile) -> Path:
    """Keep the profile (one file per script content and arguments); return its path."""
    path = _path(profile)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(profile.model_dump_json(indent=1))
    tmp.replace(path)
    return path


def find(script: Path, args: list[str]) -> tuple[StepProfile | None, Freshness]:
    """The newest profile of this script and arguments, and whether the script changed since."""
    script = script.expanduser().resolve()
    root = layout.profiles_dir()
    exact = root / f"{script_digest(script, args)}.json"
    if exact.is_file():
        return _read(exact), Freshness.FRESH
    same: list[StepProfile] = []
    for path in root.glob("*.json") if root.is_dir() else []:
        found = _read(path)
        if found is not None and found.script == str(script) and found.args == list(args):
            same.append(found)
    if not same:
        return None, Freshness.MISSING
    return max(same, key=lambda p: p.created), Freshness.STALE


def profiled_args(script: Path) -> list[list[str]]:
    """The argument lists this script (its current content) has profiles for, newest first."""
    script = script.expanduser().resolve()
    digest = hashlib.sha256(script.read_bytes()).hexdigest() if script.is_file() else ""
    root = layout.profiles_dir()
    found = [_read(p) for p in (root.glob("*.json") if root.is_dir() else [])]
    mine = [p for p in found if p is not None and p.script == str(script)]
    fresh = sorted((p for p in mine if p.script_sha256 == digest), key=lambda p: -p.created)
    return list({tuple(p.args): p.args for p in fresh}.values())


def _read(path: Path) -> StepProfile | None:
    try:
        return StepProfile.model_validate_json(path.read_text())
    except (OSError, ValidationError):
        return None  # a torn or foreign file: as if there were none


def profile_command(script: Path, args: list[str]) -> str:
    """The command that (re)profiles this script, for messages: the script's path from the
    current folder when it lies under it (as it was most likely typed), else absolute."""
    try:
        shown = script.resolve().relative_to(Path.cwd().resolve())
    except (ValueError, OSError):
        shown = script
    tail = f" -- {shlex.join(args)}" if args else ""
    return f"mncloud profile {shlex.quote(str(shown))}{tail}"


def workload_from_flags(options: PlanOptions) -> Workload | None:
    """A step described by flags: FLOPs given, or (6 × parameters + 12 × layers × hidden ×
    seq-len) × tokens (a dense transformer's forward and backward, attention included when
    its shape is given). Bytes assume fp32 weights and gradients and AdamW's two fp32 moments
    (4 + 4 + 8 bytes per parameter); activations follow from the shape (`plan.sharding`),
    else are unknown (0)."""
    o = options
    described = (o.params, o.flops_per_step, o.tokens_per_step, o.grad_bytes)
    if all(v is None for v in described):
        return None
    flops = o.flops_per_step
    attention = 0.0
    if o.layers and o.hidden and o.seq_len:
        attention = attention_flops_per_token(o.layers, o.hidden, o.seq_len)
    if flops is None:
        if o.params is None or o.tokens_per_step is None:
            raise SpecError(
                "give --flops-per-step, or both --params and --tokens-per-step (FLOPs are then "
                "6 × params × tokens, plus attention with --seq-len, --layers and --hidden)"
            )
        flops = (6 * o.params + attention) * o.tokens_per_step
    n = o.params or 0
    return Workload(
        flops_per_step=flops,
        grad_bytes=o.grad_bytes if o.grad_bytes is not None else 4 * n,
        weight_bytes=4 * n,
        optimizer_bytes=8 * n,
        params=n,
        layers=o.layers,
        hidden=o.hidden,
        seq_len=o.seq_len,
        tokens_per_step=o.tokens_per_step,
        micro_batches=o.micro_batches or 1,
        recompute=o.recompute,
    )


def resolve_workload(
    options: PlanOptions, script: Path | None = None, args: list[str] | None = None
) -> tuple[Workload | None, str]:
    """The step's cost for a plan, and where it came from: the flags, else the script's fresh
    profile. With `--steps`, a missing or stale profile is a ProfileError naming the command
    to run; without, the plan goes on by `--hours` and the source says why."""
    flags = workload_from_flags(options)
    if flags is not None:
        return flags, "your flags (--params / --flops-per-step / --tokens-per-step)"
    if script is None:
        return None, ""
    found, freshness = find(script, list(args or []))
    command = profile_command(script, list(args or []))
    if freshness is Freshness.FRESH and found is not None:
        when = time.strftime("%Y-%m-%d %H:%M", time.localtime(found.created))
        how = "shapes only" if found.meta else found.device
        return found.workload(), f"the profile of {script.name} ({how}, {when})"
    if freshness is Freshness.STALE:
        why = f"the profile of {script.name} is stale (the script changed since)"
    else:
        why = f"{script.name} has no profile for these arguments"
        others = profiled_args(script)
        if others:
            shown = "; ".join(f"`-- {shlex.join(a)}`" if a else "no arguments" for a in others)
            why = f"{script.name} was profiled only with other arguments ({shown})"
    if options.steps is not None:
        raise ProfileError(
            f"--steps: {why}; add --profile to profile it with these arguments now, or run "
            f"`{command}` first"
        )
    return None, f"{why}: every offer is assumed equally fast; `{command}` times it"
