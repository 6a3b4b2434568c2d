"""JobSpec (+ Plan) → SkyPilot task YAML, through the Jinja2 templates in `mncloud/templates/`.

The result is validated with SkyPilot's own code (its task schema, which knows keywords plain
jsonschema does not, and `sky.Task.from_yaml_config`) before anyone sees it.

Template variables (also what a `--template PATH` of your own receives):

| variable | meaning |
|---|---|
| `name`, `num_nodes`, `workdir` | run name, node count, local project folder synced to nodes |
| `resources` | dict for `resources:` (accelerators or cpus, use_spot, infra, disk_size, …) |
| `job_recovery` | dict for `resources.job_recovery` (every cloud run is a managed job) |
| `resource_choices`, `resource_choice_mode` | list of resource dicts and `ordered`/`any_of` |
| `envs` | dict of environment variables (user `--env` + `MNCLOUD_*`) |
| `secrets` | list of secret names (values never rendered) |
| `file_mounts` | dict of mount path → mount spec (`--mount-bucket`, `--ckpt-dir`) |
| `script`, `script_args` | the script relative to workdir, and its arguments (quote with `q`) |
| `script_words` | the arguments as shell words, the `--ckpt-dir` path as `$MNCLOUD_CKPT_DIR` |
| `resume_words` | `--resume-args` as shell words, added on a node with a committed unit |
| `launcher`, `command` | torchrun, accelerate, deepspeed or none; `none`: the words to run |
| `recovery` | `gang` (one torchrun job over all nodes) or `node` (one replica group per node) |
| `ckpt_dir`, `ckpt_dir_uri` | `--ckpt-dir`; where each node's sync keeps it (`foldersync.py`) |
| `ckpt_dir_target` | the folder in the mounted bucket it links to where mncloud is not installed |
| `nproc_per_node` | shell word: `$SKYPILOT_NUM_GPUS_PER_NODE`, or the count for `cpu:N` |
| `master_port`, `nccl_debug`, `nccl_socket_ifname` | rendezvous port and NCCL settings |
| `requirements`, `user_setup` | pip requirements file (relative) and the `--setup` command |
| `preempted_exit_code`, `c` | the preemption exit code and `mncloud.constants` |
| `preflight`, `preflight_gpus`, `require_paths` | node checks before torchrun (`mncloud.doctor`) |
| `bandwidth_expect`, `bandwidth_fabric`, `bandwidth_min` | the preflight's all-reduce test |
| `group_nodes` | a job group's node count (0 otherwise): its nodes meet in the bucket |
| `export_on_finish`, `export_dir` | `up --export-on-finish` format (or None), its folder name |

Filters: `q` (shell-quote), `yaml` (one safe YAML value), `yaml_block` (a multi-line string
as a YAML block). The shell templates `setup.sh.j2` and `run.sh.j2` can be included.

A task's YAML is checked against SkyPilot's cached schema first (`schema.py`); the task
`mncloud doctor --bandwidth RUN` hands a live cluster is `bandwidth.py`.

The fast network (`network.py`): `network_tier: best` on each entry whose fabric needs it,
the fabric's env, and the bus bandwidth the preflight expects.

One tracker run per training run (`trackers.py`): W&B's run id and resume, the TensorBoard
folder in `--ckpt-dir`, among `envs` once `up` gave the run its id.

`--recovery node` on a cloud renders a SkyPilot job group instead (`jobgroup.py`,
`templates/jobgroup.yaml.j2`): each node task is this template with its own variables.
"""

from __future__ import annotations

import copy
import json
import re
import shlex
from dataclasses import dataclass
from importlib import resources as importlib_resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from mncloud import __version__, constants, layout
from mncloud.errors import RenderError
from mncloud.render import jobgroup, network, trackers
from mncloud.spec import (
    BUCKET_MOUNT_PATH,
    Accelerator,
    JobSpec,
    Launcher,
    Recovery,
)
from mncloud.spec.scriptargs import resume_shell_words, script_shell_words

if TYPE_CHECKING:
    import jinja2

    from mncloud.plan import Plan

TASK_TEMPLATE = "task.yaml.j2"
MOUNT_PATH = BUCKET_MOUNT_PATH
#: SkyPilot's MOUNT_CACHED preset for read-write checkpoints (parallel uploads and reads).
CKPT_MOUNT_TYPE = "MODEL_CHECKPOINT_RW"
#: Exit codes SkyPilot recovers however often (never counted against max_restarts_on_errors):
#: a stop for a preemption notice, and a storage outage met by the nodes' preflight.
RECOVER_ON_EXIT_CODES = (constants.PREEMPTED_EXIT_CODE, constants.STORAGE_OUTAGE_EXIT_CODE)


@dataclass(frozen=True)
class RenderedTask:
    """A validated SkyPilot task: its YAML text, the config parsed once, and its market."""

    yaml_text: str
    config: dict[str, Any]
    spot: bool = False
    """Whether the task runs on spot: decided once by `uses_spot`, read by every backend."""
    documents: tuple[dict[str, Any], ...] = ()
    """A job group's documents (header, lighthouse, node tasks; `jobgroup.py`), else empty;
    `config` is then node 0's task."""

    def to_json(self) -> str:
        return json.dumps(list(self.documents) or self.config, indent=2)


def render(
    spec: JobSpec,
    plan: Plan | None = None,
    template: str | Path | None = None,
    run_id: str | None = None,
) -> RenderedTask:
    """Render and validate the task for `spec`; `plan` adds ordered resource fallbacks.

    `run_id` (given by `up`, not by `render`) reaches every node as `MNCLOUD_RUN_ID`.
    """
    env = _environment(Path(template).expanduser().resolve().parent if template else None)
    name = Path(template).name if template else TASK_TEMPLATE
    if template and not Path(template).expanduser().is_file():
        raise RenderError(f"--template {str(template)!r} does not exist")
    variables = template_variables(spec, plan, run_id)
    if jobgroup.applies(spec):
        return _render_job_group(spec, uses_spot(spec, plan), env, name, variables)
    text = _render_text(env, name, variables)
    try:
        config = yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise RenderError(f"template {name} produced invalid YAML: {err}") from None
    if not isinstance(config, dict):
        raise RenderError(f"template {name} must produce a YAML mapping")
    validate_task_config(config)
    spot = uses_spot(spec, plan)
    if _config_asks_spot(config) != spot:
        raise RenderError(
            f"template {name} sets use_spot against the plan ({'spot' if spot else 'on-demand'}); "
            "render `resources` from the template variables"
        )
    return RenderedTask(yaml_text=text, config=config, spot=spot)


def rendered_from_yaml(text: str) -> RenderedTask:
    """A task rendered before (a run record's YAML, for `exec`), parsed and checked again;
    its market is what it asks for. A job group's multi-document YAML is refused."""
    try:
        config = yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise RenderError(f"the recorded task is not valid YAML: {err}") from None
    if not isinstance(config, dict):
        raise RenderError("the recorded task is not one task (a job group cannot be exec'd)")
    validate_task_config(config)
    return RenderedTask(yaml_text=text, config=config, spot=_config_asks_spot(config))


def _render_text(env: jinja2.Environment, name: str, variables: dict[str, Any]) -> str:
    import jinja2

    try:
        return env.get_template(name).render(**variables)
    except jinja2.TemplateError as err:
        raise RenderError(f"template {name}: {err.__class__.__name__}: {err}") from None


def _render_job_group(
    spec: JobSpec, spot: bool, env: jinja2.Environment, name: str, variables: dict[str, Any]
) -> RenderedTask:
    """`--recovery node` on clouds: the job group (`jobgroup.py`), each node task rendered
    from `name` (the task template), every document checked as the single task is."""
    group = jobgroup.group_variables(spec, variables, name)
    text = _render_text(env, jobgroup.TEMPLATE, group)
    documents = jobgroup.parse(text, jobgroup.TEMPLATE)
    for document in documents[1:]:
        validate_task_config(document)
    jobgroup.check_shape(spec, documents, spot)
    jobgroup.validate(documents, text)
    return RenderedTask(text, documents[2], spot, tuple(documents))


def task_env(spec: JobSpec, spot: bool, run_id: str | None = None) -> dict[str, str]:
    """Environment every node gets: the user's `--env` plus mncloud's own variables.

    A spot task always watches for preemption notices, whoever chose spot (`--spot` or the
    plan under the default market).
    """
    envs = dict(spec.envs)
    envs[constants.RUN_NAME_ENV] = spec.name
    if run_id:
        envs[constants.RUN_ID_ENV] = run_id
    if spec.bucket is not None:
        envs[constants.CKPT_URI_ENV] = layout.ckpt_uri(spec.bucket, spec.name)
    if spec.ckpt_dir:
        envs[constants.CKPT_DIR_ENV] = spec.ckpt_dir
    if spot:
        envs[constants.PREEMPTION_WATCH_ENV] = "1"
    if spec.recovery is Recovery.NODE:
        envs[constants.RECOVERY_ENV] = spec.recovery.value
        envs[constants.NUM_REPLICAS_ENV] = str(spec.nodes)
    if spec.parallel is not None:
        envs[constants.PARALLEL_ENV] = spec.parallel.value
    envs.update(trackers.tracker_env(spec, run_id))
    return envs


def template_variables(
    spec: JobSpec, plan: Plan | None = None, run_id: str | None = None
) -> dict[str, Any]:
    """All variables a task template receives (see the module docstring)."""
    choices, mode = _resource_choices(spec, plan)
    use_spot = uses_spot(spec, plan)
    resources = _resources(spec, use_spot)
    if spec.gpu_alternatives:  # each entry names its GPU type (SkyPilot: no list beside them)
        resources.pop("accelerators", None)
        if not choices:
            resources["accelerators"] = [str(a) for a in _accelerators(spec)]
        elif plan is None:
            choices = [{**c, "accelerators": str(a)} for a in _accelerators(spec) for c in choices]
    choices = network.with_tiers(spec, choices)
    envs = {**network.fabric_env(spec, choices), **task_env(spec, use_spot, run_id)}
    network.require_preflight(spec)
    expected = network.expected_busbw(spec, choices)
    gpus_per_node = f'"${constants.SKYPILOT_NUM_GPUS_PER_NODE}"'
    return {
        "mncloud_version": __version__,
        "name": spec.name,
        "num_nodes": spec.nodes,
        "workdir": str(spec.workdir),
        "resources": resources,
        "job_recovery": _job_recovery(spec),
        "resource_choices": choices,
        "resource_choice_mode": mode,
        "envs": envs,
        "secrets": list(spec.secrets),
        "file_mounts": _file_mounts(spec),
        "script": spec.script_relpath,
        "script_args": list(spec.script_args),
        "script_words": script_shell_words(spec.script_args, spec.ckpt_dir),
        "resume_words": resume_shell_words(spec.resume_args),
        "launcher": spec.launcher.value,
        "recovery": spec.recovery.value,
        "command": _command(spec),
        "ckpt_dir": spec.ckpt_dir,
        "ckpt_dir_target": _ckpt_dir_target(spec),
        "ckpt_dir_uri": (
            layout.ckpt_dir_uri(layout.ckpt_uri(spec.bucket, spec.name)) if spec.bucket else None
        ),
        "nproc_per_node": str(spec.accelerator.count) if spec.accelerator.is_cpu else gpus_per_node,
        "master_port": spec.rendezvous_port,
        "nccl_debug": spec.nccl_debug,
        "nccl_socket_ifname": spec.nccl_socket_ifname,
        "requirements": spec.requirements.as_posix() if spec.requirements else None,
        "user_setup": spec.setup,
        "preempted_exit_code": constants.PREEMPTED_EXIT_CODE,
        "preflight": spec.preflight,
        "preflight_gpus": "0" if spec.accelerator.is_cpu else gpus_per_node,
        "require_paths": list(spec.require_paths),
        "bandwidth_expect": round(expected[0], 3) if expected else None,
        "bandwidth_fabric": expected[1] if expected else None,
        "bandwidth_min": spec.min_bandwidth,
        "group_nodes": 0,  # a job group's node count (render/jobgroup.py): meet in the bucket
        "export_on_finish": spec.export_on_finish.value if spec.export_on_finish else None,
        "export_dir": layout.EXPORT_DIR,
        "c": constants,
    }


def _accelerators(spec: JobSpec) -> list[Accelerator]:
    """Every GPU type the spec allows, the first one first (`--gpus H100:8,A100-80GB:8`)."""
    return [spec.accelerator, *spec.gpu_alternatives]


def uses_spot(spec: JobSpec, plan: Plan | None) -> bool:
    """The one place the market is decided: the plan's choice, else only an explicit --spot."""
    if plan is not None:
        return bool(plan.choice.spot)
    return spec.spot.use_spot is True


def _config_asks_spot(config: dict[str, Any]) -> bool:
    """Whether a rendered config asks for spot (top level or any ordered/any_of entry)."""
    resources = config.get("resources") or {}
    entries = [resources, *resources.get("ordered", []), *resources.get("any_of", [])]
    return any(bool(entry.get("use_spot")) for entry in entries)


def _resources(spec: JobSpec, use_spot: bool) -> dict[str, Any]:
    resources: dict[str, Any] = {}
    if spec.accelerator.is_cpu:
        resources["cpus"] = f"{spec.accelerator.count}+"
    else:
        resources["accelerators"] = str(spec.accelerator)
    resources["use_spot"] = use_spot
    if spec.disk_size:
        resources["disk_size"] = spec.disk_size
    if spec.image:
        resources["image_id"] = spec.image
    if spec.labels:
        resources["labels"] = dict(spec.labels)
    return resources


def _job_recovery(spec: JobSpec) -> dict[str, Any]:
    """Spot or on-demand, every cloud run is a managed job: restarted after a lost VM, after
    `--max-restarts` user-code errors, and always after a clean stop on a preemption notice
    (115) or a storage outage (75: the nodes' bucket did not answer), neither counted."""
    # EAGER_NEXT_REGION tears the whole fleet down on every flap; for several nodes FAILOVER
    # first retries where the cluster was. One node: eager is SkyPilot's own default.
    strategy = "FAILOVER" if spec.nodes > 1 else "EAGER_NEXT_REGION"
    return {
        "strategy": strategy,
        "max_restarts_on_errors": spec.max_restarts,
        "recover_on_exit_codes": list(RECOVER_ON_EXIT_CODES),
    }


def _resource_choices(spec: JobSpec, plan: Plan | None) -> tuple[list[dict[str, Any]], str]:
    """SkyPilot `ordered` (from a plan) or `any_of` (several clouds/regions) entries."""
    if plan is not None:
        return plan.ordered_resources(), "ordered"
    clouds = [c for c in spec.clouds if c != "local"]
    if not clouds and not spec.regions:
        return [], "any_of"
    if not clouds:
        raise RenderError("--region needs --cloud: a region name belongs to one cloud")
    infras = [f"{cloud}/{region}" for cloud, region in _cloud_regions(clouds, spec.regions)]
    if len(infras) == 1:
        return [{"infra": infras[0]}], "any_of"
    return [{"infra": infra} for infra in infras], "any_of"


def _cloud_regions(clouds: list[str], regions: list[str]) -> list[tuple[str, str]]:
    """Pair each region with the clouds that have it (by SkyPilot's catalog).

    A region no named cloud has is a RenderError that lists the valid names.
    """
    if not regions:
        return [(cloud, "*") for cloud in clouds]
    pairs = []
    for region in regions:
        owners, valid = [], []
        for cloud in clouds:
            known = _region_error(cloud, region)
            if known is None:
                owners.append(cloud)
            else:
                valid.append(f"{cloud}: {known}")
        if not owners:
            where = " or ".join(clouds)
            raise RenderError(
                f"--region {region!r} is not a {where} region; valid: {'; '.join(valid)}"
            )
        pairs.extend((cloud, region) for cloud in owners)
    return pairs


def _region_error(cloud: str, region: str) -> str | None:
    """None when `cloud` has `region` in SkyPilot's catalog, else the cloud's region names.

    A region the offers index (`catalog_index`) lists is answered without SkyPilot; any other
    is asked of SkyPilot, whose message lists the names.
    """
    from mncloud.catalog import cache as skycache
    from mncloud.catalog import index as catalog_index

    if skycache.enabled() and catalog_index.region_known(cloud, region):
        return None
    from sky.utils import registry

    try:
        registry.CLOUD_REGISTRY.from_str(cloud).validate_region_zone(region, None)
    except ValueError as err:
        # SkyPilot lists the regions ("…regions: 'a, b'") or the close ones ("…these: 'a'?").
        names = re.search(r"(?:regions|these): '([^']*)'", str(err))
        return names.group(1) if names else "see `sky show-gpus --all-regions`"
    return None


def _file_mounts(spec: JobSpec) -> dict[str, Any]:
    """The bucket, mounted with MOUNT_CACHED, for `--mount-bucket` or `--ckpt-dir`.

    MOUNT modes take a whole bucket (SkyPilot refuses `s3://bucket/prefix`), so `--ckpt-dir`
    becomes a link to `<mount>/<prefix>/<name>/ckpt-dir`, made by the run script.
    MOUNT_CACHED writes to the node's disk and uploads a file once it is closed: a file still
    being written when the VM goes never reaches the bucket (the older object stays whole).
    """
    wants_mount = spec.mount_bucket or (spec.ckpt_dir and not spec.is_local)
    if not wants_mount or spec.bucket is None or spec.bucket.scheme == "file":
        return {}
    mount: dict[str, Any] = {"source": spec.bucket.root, "mode": "MOUNT_CACHED"}
    if spec.ckpt_dir:
        mount["type"] = CKPT_MOUNT_TYPE
    return {MOUNT_PATH: mount}


def _ckpt_dir_target(spec: JobSpec) -> str | None:
    """The folder in the mounted bucket that `--ckpt-dir` links to on a cloud node."""
    if not spec.ckpt_dir or spec.bucket is None or spec.bucket.scheme == "file":
        return None
    return layout.mounted_ckpt_dir(MOUNT_PATH, spec.bucket.prefix, spec.name)


def _command(spec: JobSpec) -> list[str]:
    """`--launcher none`: the words that run the script itself (python for `.py`, bash for
    `.sh`, else the file as a program)."""
    if spec.launcher is not Launcher.NONE:
        return []
    script = spec.script_relpath
    if script.endswith(".py"):
        return ["python", script]
    if script.endswith(".sh"):
        return ["bash", script]
    return [script if "/" in script else f"./{script}"]


def validate_task_config(config: dict[str, Any]) -> None:
    """Check a task config with SkyPilot's schema and parser; raise RenderError on failure.

    A task `taskcheck.surely_valid` vouches for (the shapes mncloud renders, checked against
    SkyPilot's cached schema and catalog) skips the SkyPilot import; any other gets SkyPilot's
    own verdict and message.
    """
    from mncloud.render import schema as taskcheck

    if taskcheck.surely_valid(config):
        return
    from sky import Task
    from sky.utils import common_utils, schemas

    try:
        common_utils.validate_schema(config, schemas.get_task_schema(), "")
        Task.from_yaml_config(copy.deepcopy(config))  # SkyPilot pops keys from its argument
    except Exception as err:  # SkyPilot raises ValueError and its own exception types
        message = " ".join(str(err).split())
        raise RenderError(f"SkyPilot rejects the task: {message}") from None


def _environment(extra_dir: Path | None) -> jinja2.Environment:
    import jinja2

    loaders: list[jinja2.BaseLoader] = []
    if extra_dir is not None:
        loaders.append(jinja2.FileSystemLoader(str(extra_dir)))
    loaders.append(jinja2.FileSystemLoader(str(template_dir())))
    env = jinja2.Environment(
        loader=jinja2.ChoiceLoader(loaders),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        autoescape=False,
    )
    env.filters["q"] = lambda value: shlex.quote(str(value))
    env.filters["yaml"] = _yaml_value
    env.filters["yaml_block"] = _yaml_block
    return env


def template_dir() -> Path:
    """The folder of mncloud's shipped templates."""
    return Path(str(importlib_resources.files("mncloud") / "templates"))


def _yaml_value(value: Any) -> str:
    """One YAML value on one line: scalars quoted as needed, mappings/lists in flow style."""
    text = yaml.safe_dump(value, default_flow_style=True, width=10_000, sort_keys=False)
    return text.removesuffix("\n...\n").rstrip("\n")


class _BlockDumper(yaml.SafeDumper):
    pass


def _block_str(dumper: yaml.SafeDumper, data: str) -> yaml.ScalarNode:
    return dumper.represent_scalar("tag:yaml.org,2002:str", data, style="|")


_BlockDumper.add_representer(str, _block_str)


def _yaml_block(text: str) -> str:
    """A multi-line shell script as a YAML literal block, indented under its key.

    PyYAML decides the exact form, so any content (quotes, newlines inside quoted arguments)
    parses back byte for byte.
    """
    dumped = yaml.dump(text.strip("\n") + "\n", Dumper=_BlockDumper, width=10_000)
    return dumped.removesuffix("...\n").rstrip("\n")
