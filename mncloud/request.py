"""The request as a user gives it: flags over the project's `mncloud.yaml`, built into one
validated `JobSpec` (`build_spec`). Nothing downstream sees flags or the config file.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import re
import secrets
from collections.abc import Callable
from pathlib import Path, PurePosixPath
from typing import Any, get_type_hints

import yaml
from pydantic import ConfigDict, ValidationError, create_model

from mncloud import constants, layout
from mncloud.errors import SpecError, first_error
from mncloud.options import FLAG_ONLY as FLAG_ONLY  # re-exported: its old home
from mncloud.options import JOB_FIELDS, YAML_KEYS, JobOptions, job_default
from mncloud.spec import (
    BUCKET_MOUNT_PATH,
    LOCAL_CLOUD,
    MIN_NODES,
    Accelerator,
    JobSpec,
    Launcher,
    NetworkTier,
    Parallel,
    Recovery,
    SpotPolicy,
    Tracker,
    checked_nodes,
    min_nodes_error,
)
from mncloud.spec.scriptargs import resume_words
from mncloud.storage.url import BucketURL


def parse_key_values(items: list[str], flag: str) -> dict[str, str]:
    """Parse repeated `K=V` flags into a dict; `K` alone is an error."""
    result: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise SpecError(f"{flag} {item!r}: write KEY=VALUE")
        result[key] = value
    return result


def is_file(path: Path) -> bool:
    """`path.is_file()`, False for a path the system cannot even look up (a name too long)."""
    try:
        return path.is_file()
    except (OSError, ValueError):
        return False


def user_path(text: str | Path, flag: str) -> Path:
    """A path as a user typed it, `~` expanded; SpecError for `~name` of no such user."""
    try:
        return Path(text).expanduser()
    except RuntimeError:
        raise SpecError(f"{flag} {str(text)!r}: no such user's home folder") from None


def find_workdir(script: Path) -> Path:
    """The script's project folder: the nearest ancestor with a project marker."""
    markers = (
        "pyproject.toml",
        "setup.py",
        "requirements.txt",
        ".git",
        constants.PROJECT_CONFIG_FILE,
    )
    for folder in (script.parent, *script.parent.parents):
        if any((folder / marker).exists() for marker in markers):
            return folder
    return script.parent


def project_options(workdir: Path) -> JobOptions:
    """The options `mncloud.yaml` in the project sets (a team's committed defaults); none
    without the file. A key set to null (`nodes:` or `nodes: null`) is unset: the flag, else
    the field's default, decides."""
    path = workdir / constants.PROJECT_CONFIG_FILE
    if not is_file(path):
        return JobOptions()
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as err:
        raise SpecError(
            f"{path}: not valid YAML ({err.__class__.__name__}); fix the file"
        ) from None
    if not isinstance(data, dict):
        raise SpecError(f"{path}: expected a mapping of option: value")
    try:
        config = ProjectConfig.model_validate(data)
    except ValidationError as err:
        if err.errors()[0].get("type") == "extra_forbidden":
            raise SpecError(_unknown_keys_message(path, data)) from None
        raise SpecError(first_error(err, str(path))) from None
    return JobOptions(*(getattr(config, name, None) for name in JOB_FIELDS))


def _unknown_keys_message(path: Path, data: dict[Any, Any]) -> str:
    """The unknown keys of a mncloud.yaml, each with the nearest valid one, and every valid key."""
    valid = list(ProjectConfig.model_fields)
    named = []
    for key in sorted((k for k in data if k not in valid), key=str):
        close = difflib.get_close_matches(str(key).replace("-", "_"), valid, n=1, cutoff=0.6)
        named.append(f"{str(key)!r}" + (f" (did you mean {close[0]!r}?)" if close else ""))
    return f"{path}: unknown option {', '.join(named)}; allowed: {', '.join(valid)}"


_KEY_TYPES = get_type_hints(JobOptions)

#: `mncloud.yaml`: a team's committed defaults, its keys `JobOptions`' fields (`YAML_KEYS`),
#: named like the CLI flags ('_' for '-'), each typed as its field. Flags override it; an
#: unknown key is an error that lists the allowed ones.
ProjectConfig = create_model(  # type: ignore[call-overload]
    "ProjectConfig",
    __config__=ConfigDict(extra="forbid", allow_inf_nan=False),
    **{key: (_KEY_TYPES[key], None) for key in YAML_KEYS},
)


def flag_names() -> tuple[str, ...]:
    """Every option `build_spec` takes: the settings of mncloud.yaml, then the flag-only ones."""
    return tuple(JOB_FIELDS)


def build_spec(
    script: str | Path,
    script_args: list[str] | None = None,
    *,
    default_name: Callable[[str], str] | None = None,
    on_local: Callable[[str], None] | None = None,
    **flags: Any,
) -> JobSpec:
    """`spec_from` with the options as keywords named like the flags (`JobOptions`' fields),
    for a caller that is no command (tests, scripts); an unknown one is a TypeError."""
    return spec_from(
        script, script_args, JobOptions(**flags), default_name=default_name, on_local=on_local
    )


def spec_from(
    script: str | Path,
    script_args: list[str] | None,
    flags: JobOptions,
    *,
    default_name: Callable[[str], str] | None = None,
    on_local: Callable[[str], None] | None = None,
) -> JobSpec:
    """Build a JobSpec from the options the flags say over the project's `mncloud.yaml`
    defaults (`JobOptions.over`); an option left None or empty keeps the project's value.

    `spot`: True = spot only, False = on-demand only, None = either (the planner decides).
    `default_name(stem)`: the run name when neither flags nor mncloud.yaml give one (default:
    the script's stem; `up` passes `unique_name`). `on_local(notice)`: run on this machine when
    no cloud is named and SkyPilot has none enabled (`local_when_no_cloud`), and say so.
    Raises SpecError with a one-line, actionable message.
    """
    script_path = user_path(script, "script")
    if not is_file(script_path):
        raise SpecError(
            f"script {str(script)!r} does not exist; give the path of your training script"
        )
    script_path = script_path.resolve()
    workdir = find_workdir(script_path)
    options = flags.over(project_options(workdir))
    if on_local is not None:
        options, notice = local_when_no_cloud(options)
        if notice:
            on_local(notice)
    if not options.name:
        name = (default_name or (lambda stem: stem))(script_stem(script_path))
        options = dataclasses.replace(options, name=name)
    return _spec_from_options(options, script_path, workdir, list(script_args or []))


#: Local CPU nodes when no cloud is enabled: two processes per node, or one on a 1-core machine.
LOCAL_CPUS = max(1, min(2, os.cpu_count() or 1))


def local_when_no_cloud(options: JobOptions) -> tuple[JobOptions, str | None]:
    """Where no cloud is named (flag or mncloud.yaml), no GPU is asked for and SkyPilot has no
    cloud enabled: the options with `cloud` local and `gpus` cpu:N, and the one-line notice;
    else the options unchanged and None."""
    gpus = str(options.gpus or "").strip()
    if as_list(options.cloud) or (gpus and not gpus.lower().startswith("cpu")):
        return options, None
    from mncloud.catalog.clouds import enabled_clouds

    if enabled_clouds() != []:  # some enabled, or SkyPilot's state is elsewhere: unknown
        return options, None
    local = dataclasses.replace(options, cloud=[LOCAL_CLOUD], gpus=gpus or f"cpu:{LOCAL_CPUS}")
    return local, (
        "no cloud is enabled in SkyPilot (`sky check` found none): running on this machine, "
        f"--cloud local --gpus {local.gpus}"
    )


def as_list(value: Any) -> list[str]:
    """A flag or config value (None, one word or several) as a list of strings."""
    if value is None:
        return []
    if isinstance(value, (list, tuple)):
        return [str(v) for v in value]
    return [str(value)]


def _as_mapping(value: Any, flag: str) -> dict[str, str]:
    if isinstance(value, dict):
        return {str(k): str(v) for k, v in value.items()}
    return parse_key_values(as_list(value), flag)


def _or_default(value: Any, name: str) -> Any:
    """An option's value, or its default (`job_default`) when nobody said it."""
    return job_default(name) if value is None else value


def _spec_from_options(
    opts: JobOptions, script: Path, workdir: Path, script_args: list[str]
) -> JobSpec:
    if not opts.gpus:
        raise SpecError("--gpus is required, e.g. --gpus H100:8 (or cpu:2 for local CPU nodes)")
    accelerator, *alternatives = Accelerator.parse_list(str(opts.gpus))
    nodes = checked_nodes(_or_default(opts.nodes, "nodes"))
    spot = spot_policy(opts.spot)
    bucket = BucketURL.parse(str(opts.bucket)) if opts.bucket else None
    requirements = _requirements(opts.requirements, workdir)
    if opts.mount_bucket and bucket is None:
        raise SpecError("--mount-bucket needs --bucket s3://… or gs://…")
    if opts.mount_bucket and bucket is not None and bucket.scheme == "file":
        raise SpecError("--mount-bucket works with s3:// or gs:// buckets, not file://")
    name = opts.name or script_stem(script)
    try:
        return JobSpec(
            script=script,
            script_args=script_args,
            workdir=workdir,
            name=str(name),
            accelerator=accelerator,
            gpu_alternatives=alternatives,
            nodes=nodes,
            min_nodes=_min_nodes(opts.min_nodes, nodes),
            spot=spot,
            clouds=as_list(opts.cloud),
            regions=as_list(opts.region),
            bucket=bucket,
            mount_bucket=bool(opts.mount_bucket),
            envs=_checked_envs(opts),
            secrets=as_list(opts.secret),
            setup=opts.setup,
            requirements=requirements,
            disk_size=opts.disk_size,
            image=opts.image,
            labels=_as_mapping(opts.label, "--label"),
            max_hourly=opts.max_hourly,
            max_restarts=_or_default(opts.max_restarts, "max_restarts"),
            master_port=opts.master_port,
            nccl_debug=opts.nccl_debug,
            nccl_socket_ifname=opts.nccl_socket_ifname,
            network=_network(opts.network),
            min_bandwidth=_min_bandwidth(opts.min_bandwidth),
            require_paths=as_list(opts.require_path),
            preflight=bool(_or_default(opts.preflight, "preflight")),
            launcher=Launcher.parse(opts.launcher or job_default("launcher")),
            ckpt_dir=_checked_ckpt_dir(opts, workdir, bucket),
            resume_args=resume_words(opts.resume_args, opts.ckpt_dir),
            recovery=_recovery(opts, script, nodes, bucket),
            parallel=_parallel(opts.parallel, nodes),
            tracker=Tracker.read(opts.tracker or job_default("tracker"), "--tracker"),
        )
    except ValidationError as err:
        raise SpecError(first_error(err)) from None


_OPTS_IN = re.compile(r"\bReplicas\s*\(")
"""How a script opts in to node recovery: it builds a `mncloud.train.Replicas`."""


def opts_in_to_node_recovery(script: Path) -> bool:
    """True when the script uses `mncloud.train.Replicas` (each node a replica group)."""
    try:
        return bool(_OPTS_IN.search(script.read_text(errors="replace")))
    except OSError:
        return False


def _min_nodes(value: Any, nodes: int) -> int | None:
    """`--min-nodes` (None: the gang waits for all `--nodes`): from 1 to `--nodes`."""
    if value is None:
        return None
    whole = isinstance(value, int) and not isinstance(value, bool)
    if not whole or not MIN_NODES <= value <= nodes:
        raise SpecError(min_nodes_error(value, nodes))
    return int(value)


def _parallel(value: Any, nodes: int) -> Parallel | None:
    """`--parallel ddp|fsdp|hsdp` (None: the script's own choice); hsdp needs 2+ nodes."""
    if value is None:
        return None
    text = str(getattr(value, "value", value)).strip().lower()
    try:
        parallel = Parallel(text)
    except ValueError:
        raise SpecError(f"--parallel {value!r} is unknown; choose ddp, fsdp or hsdp") from None
    if parallel is Parallel.HSDP and nodes < 2:
        raise SpecError("--parallel hsdp needs --nodes 2 or more (it replicates across nodes, "
                        "shards inside each); on one node use --parallel fsdp")  # fmt: skip
    return parallel


def _network(value: Any) -> NetworkTier:
    """`--network best|standard` (or mncloud.yaml's `network`); a fabric's name is no setting."""
    if value is None:
        return NetworkTier(job_default("network"))
    text = str(getattr(value, "value", value)).strip().lower()
    try:
        return NetworkTier(text)
    except ValueError:
        raise SpecError(
            f"--network {value!r} is not a setting: choose best (each offer's fast fabric: "
            "EFA, GPUDirect-TCPX, InfiniBand) or standard (TCP); fabrics are not named"
        ) from None


def _min_bandwidth(value: Any) -> float | None:
    """`--min-bandwidth GBPS`: a positive, finite number of GB/s."""
    if value is None:
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        number = float("nan")
    if not number > 0 or number == float("inf"):
        raise SpecError(
            f"--min-bandwidth {value!r} must be a positive number of GB/s (bus bandwidth), "
            "e.g. --min-bandwidth 5"
        )
    return number


def _recovery(opts: JobOptions, script: Path, nodes: int, bucket: BucketURL | None) -> Recovery:
    """`--recovery gang|node`; without it, node when the script opts in and runs on 2+ nodes,
    locally or on a cloud with a bucket (where a job group's nodes find the lighthouse), else
    gang."""
    value, opted_in = opts.recovery, opts_in_to_node_recovery(script)
    launcher = str(getattr(opts.launcher, "value", opts.launcher or "torchrun"))
    if value is None:  # node where it can run: locally, or on a cloud with a bucket
        local = as_list(opts.cloud) == [LOCAL_CLOUD]
        placeable = local or (bucket is not None and bucket.scheme != "file")
        auto = opted_in and nodes >= 2 and launcher == "torchrun" and placeable
        return Recovery.NODE if auto else Recovery.GANG
    try:
        recovery = Recovery(str(getattr(value, "value", value)).strip().lower())
    except ValueError:
        raise SpecError(f"--recovery {value!r} is unknown; choose gang or node") from None
    if recovery is Recovery.GANG:
        return recovery
    if nodes < 2:
        raise SpecError("--recovery node needs --nodes 2 or more: one node has no peer to heal "
                        "from; use --recovery gang")  # fmt: skip
    if launcher != "torchrun":
        raise SpecError("--recovery node works with --launcher torchrun only; use --recovery gang")
    if not opted_in:
        raise SpecError(
            f"--recovery node: {script.name} does not use mncloud.train.Replicas, so its nodes "
            "cannot train on without a lost peer; add it (README: Node recovery) or use "
            "--recovery gang"
        )
    return recovery


def spot_policy(value: Any) -> SpotPolicy:
    """--spot/--on-demand (True/False/None) or mncloud.yaml's word for the market: the one
    mapping from the flag to the policy (`plan` without a script uses it too)."""
    if isinstance(value, bool | None):
        return SpotPolicy.from_flag(value)
    try:
        return SpotPolicy(value)
    except ValueError:
        raise SpecError(f"spot: {value!r}; use spot, on-demand or either") from None


def _requirements(value: Any, workdir: Path) -> Path | None:
    """--requirements as a path inside the workdir (it is synced to every node)."""
    if not value:
        return None
    path = (Path.cwd() / user_path(str(value), "--requirements")).resolve()
    if not is_file(path):
        raise SpecError(f"--requirements {value!r} does not exist")
    if not path.is_relative_to(workdir):
        raise SpecError(f"--requirements {value!r} must be inside {workdir}")
    return path.relative_to(workdir)


def _checked_ckpt_dir(opts: JobOptions, workdir: Path, bucket: BucketURL | None) -> str | None:
    """`--ckpt-dir`: an absolute folder outside the synced workdir and the bucket mount; on a
    cloud it lives in the bucket, so it needs an s3:// or gs:// `--bucket`."""
    if not opts.ckpt_dir:
        return None
    path, flag = PurePosixPath(str(opts.ckpt_dir)), f"--ckpt-dir {str(opts.ckpt_dir)!r}"
    if not path.is_absolute() or ".." in path.parts or len(path.parts) < 2:
        raise SpecError(f"{flag}: give an absolute folder of its own on the nodes, e.g. /ckpt")
    work, mount = PurePosixPath(workdir.as_posix()), PurePosixPath(BUCKET_MOUNT_PATH)
    if path.is_relative_to(work) or "sky_workdir" in path.parts:
        raise SpecError(f"{flag} is inside the workdir, which is synced to every node; use /ckpt")
    if path.is_relative_to(mount) or work.is_relative_to(path) or mount.is_relative_to(path):
        raise SpecError(f"{flag} overlaps the workdir or the bucket mount ({mount}); use /ckpt")
    if as_list(opts.cloud) != [LOCAL_CLOUD] and (bucket is None or bucket.scheme == "file"):
        raise SpecError(
            f"{flag} needs --bucket s3://… or gs://… on a cloud: the folder lives in the bucket "
            "and outlives the VMs"
        )
    return path.as_posix()


def _checked_envs(opts: JobOptions) -> dict[str, str]:
    """`--env` values; one that looks like a credential is refused unless the user insists:
    it would be written into the task YAML SkyPilot stores (use `--secret NAME`)."""
    envs = _as_mapping(opts.env, "--env")
    if opts.allow_secret_env:
        return envs
    from mncloud.redact import looks_like_credential

    for key, value in envs.items():
        if looks_like_credential(key, value):
            raise SpecError(
                f"--env {key}=…: the value looks like a credential and would be written into the "
                f"task YAML; pass it with --secret {key} (read from your environment at launch), "
                "or add --allow-secret-env if it is not secret"
            )
    return envs


def script_stem(script: Path) -> str:
    """The script's stem as a run name: `train.py` → `train`, `My Model.py` → `my-model`."""
    stem = re.sub(r"[^a-z0-9-]+", "-", script.stem.lower()).strip("-") or "run"
    if not stem[0].isalpha():
        stem = f"run-{stem}"
    return stem[:63].rstrip("-")


def unique_name(stem: str) -> str:
    """A new run name: the stem and a short random suffix (`train-3f9a`), as SkyPilot and
    dstack name runs; never one this machine has a run of."""
    base = stem[:58].rstrip("-")
    while True:
        name = f"{base}-{secrets.token_hex(2)}"
        if not layout.run_dir(name).exists():
            return name


_SUFFIX = re.compile(r"-[0-9a-f]{4}")


def newest_default_run(stem: str, known: list[str], flag: str) -> str:
    """The newest of `known` (oldest first) named by default after `stem` (`train`, as older
    versions named runs, or `train-3f9a`): the run `--resume`/`--replace` without --name means."""
    base = stem[:58].rstrip("-")
    for name in reversed(known):
        if name == stem or (name.startswith(base) and _SUFFIX.fullmatch(name[len(base) :])):
            return name
    raise SpecError(
        f"{flag}: no earlier run of this script ({stem} or {base}-…) on this machine; give "
        "--name NAME (`mncloud status` lists the runs)"
    )
