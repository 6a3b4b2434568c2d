"""`--recovery node` on clouds: the run as a SkyPilot job group (`execution: parallel`).

A gang of N nodes is one SkyPilot cluster: a spot preemption of any node relaunches all N.
Under node recovery each node is a torchft replica group (`mncloud.train.Replicas`), so the
run is rendered as N single-node tasks plus one small task for torchft's lighthouse, in one
multi-document YAML that SkyPilot's jobs controller runs as one managed job:

    ---                                  header: name, execution: parallel,
    name: llm                            primary_tasks: [llm-node-0, …]
    ---
    name: llm-lighthouse                 on-demand CPU task: torchft_lighthouse on :29510,
                                         its address published beside the checkpoints
    ---
    name: llm-node-0 … llm-node-N-1      one task each, the single task's resources, setup,
                                         run and mounts, with num_nodes 1 and
                                         MNCLOUD_REPLICA_ID=k

Example sequence: nodes 0-3 train; node 2's spot VM is preempted. The controller recovers
task `llm-node-2` alone (`sky/jobs/controller.py`, `_monitor_job_group_task`); nodes 0, 1
and 3 keep stepping, since min_replicas(4) = 2 still holds the quorum the lighthouse issues.
The new node 2 reads the lighthouse's address from the bucket, joins the next quorum and
heals from a live peer. The lighthouse runs on demand, so a preemption never takes the
quorum's memory away. When the node tasks (the primaries) end, SkyPilot stops the lighthouse
(an auxiliary task).

How the nodes find the lighthouse: SkyPilot 0.14 names a group's tasks for each other
(`<task>-0.<group>`, `sky/jobs/job_group_networking.py`) on Kubernetes only, so mncloud does
not rely on it (`inter_connection: false`): the lighthouse task publishes its private address
next to the checkpoints and every node task reads it before training
(`mncloud/storage/lighthouse.py`, `python -m mncloud.train.lighthouse`). SkyPilot still puts
the whole group in one cloud and region (its common-infrastructure search), where its VMs
reach each other's private addresses: on AWS its clusters share one security group that
admits traffic from itself (`sky/provision/aws/config.py`), on GCP its firewall admits
internal traffic (`sky/provision/gcp/constants.py`). So node recovery needs `--bucket`.

The preflight meets the same way: node 0's task publishes its private address and the
rendezvous port beside the checkpoints, the other node tasks read it, and the gang check and
the all-reduce bandwidth test run one rank per node before the first quorum, so the fabric's
figure reaches `status` and `--min-bandwidth` refuses before training here too
(`mncloud/doctor/meeting.py`; the node tasks' `--meet-nodes N`).

This module only names things and checks the documents; `render.py` renders them through
`templates/jobgroup.yaml.j2` (which includes the single-task template once per node).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from mncloud import __version__, constants
from mncloud.errors import RenderError, SpecError
from mncloud.spec import JobSpec, Recovery, min_replicas

TEMPLATE = "jobgroup.yaml.j2"
LIGHTHOUSE_PORT = 29510
"""torchft's default lighthouse port (`torchft_lighthouse --bind [::]:29510`)."""
TORCHFT_VERSION = "0.2.0"
"""torchft the lighthouse task installs: the version `requirements/lock.txt` pins (a test
keeps them equal)."""
LIGHTHOUSE_CPUS = "2+"
HEARTBEAT_TIMEOUT_MS = 10_000
"""A node silent this long leaves the quorum (torchft's default is 5 s; cloud networks flap)."""
JOIN_TIMEOUT_MS = 30_000
"""How long a quorum waits for stragglers once min_replicas have joined: a replacement that
is still booting is not waited for; it joins a later quorum."""
LIGHTHOUSE_RESTARTS = 3
"""Restarts of the lighthouse task after an error (it holds no state worth keeping: the nodes
re-register on their next heartbeat)."""
INTER_CONNECTION = False
"""The header's `inter_connection`: no hostnames needed (the nodes find the lighthouse through
the bucket), so SkyPilot places the group on any cloud, not only on Kubernetes."""

_HEADER_FIELDS = {"name", "execution", "primary_tasks", "inter_connection"}
_SAFE_NAME = re.compile(r"^[A-Za-z0-9_-]+$")


def applies(spec: JobSpec) -> bool:
    """Whether `spec` renders as a job group: node recovery on a cloud (local runs it itself)."""
    return spec.recovery is Recovery.NODE and not spec.is_local


def lighthouse_task(name: str) -> str:
    """The lighthouse task's name in run `name`'s group."""
    return f"{name}-lighthouse"


def node_task(name: str, index: int) -> str:
    """Node `index`'s task name in run `name`'s group."""
    return f"{name}-node-{index}"


def node_tasks(name: str, nodes: int) -> list[str]:
    """The node tasks' names, in replica order: the group's primary tasks."""
    return [node_task(name, k) for k in range(nodes)]


def require_bucket(spec: JobSpec) -> None:
    """SpecError unless the run has a bucket its VMs reach: the nodes find the lighthouse there."""
    if spec.bucket is None or spec.bucket.scheme == "file":
        raise SpecError(
            "--recovery node on a cloud needs --bucket s3://… or gs://…: its nodes find "
            "torchft's lighthouse there (and a whole-gang loss resumes from it); or use "
            "--recovery gang"
        )


def mncloud_source() -> str | None:
    """This mncloud's source tree when it runs from a checkout (the lighthouse task installs
    it from there), else None (it installs the same version from the package index)."""
    source = Path(__file__).resolve().parents[2]
    return str(source) if (source / "pyproject.toml").is_file() else None


def group_variables(
    spec: JobSpec, task_variables: dict[str, Any], task_template: str
) -> dict[str, Any]:
    """What `jobgroup.yaml.j2` receives: the single task's variables (each node task renders
    `task_template` with them, `name`, `num_nodes` and `envs` replaced) plus the group's."""
    name = spec.name
    require_bucket(spec)
    nodes = []
    for k, task_name in enumerate(node_tasks(name, spec.nodes)):
        envs = dict(task_variables["envs"])
        envs[constants.REPLICA_ID_ENV] = str(k)
        nodes.append({"name": task_name, "envs": envs})
    lighthouse_envs = {constants.RUN_NAME_ENV: name}
    for key in (constants.RUN_ID_ENV, constants.CKPT_URI_ENV):  # where to publish, for whom
        if task_variables["envs"].get(key):
            lighthouse_envs[key] = task_variables["envs"][key]
    return {
        **task_variables,
        "group_name": name,
        "group_nodes": spec.nodes,  # each node's preflight meets the others in the bucket
        "task_template": task_template,
        "primary_tasks": [node["name"] for node in nodes],
        "inter_connection": INTER_CONNECTION,
        "nodes": nodes,
        "lighthouse": {
            "name": lighthouse_task(name),
            "resources": {"cpus": LIGHTHOUSE_CPUS, "use_spot": False},
            "job_recovery": {"max_restarts_on_errors": LIGHTHOUSE_RESTARTS},
            "envs": lighthouse_envs,
            "secrets": task_variables.get("secrets") or [],
            "source": mncloud_source(),
            "mncloud_version": __version__,
            "torchft_version": TORCHFT_VERSION,
            "port": LIGHTHOUSE_PORT,
            "min_replicas": min_replicas(spec.nodes),
            "heartbeat_timeout_ms": HEARTBEAT_TIMEOUT_MS,
            "join_timeout_ms": JOIN_TIMEOUT_MS,
        },
    }


def parse(text: str, template: str) -> list[dict[str, Any]]:
    """The rendered group's documents, header first; RenderError if they are not mappings."""
    try:
        documents = [doc for doc in yaml.safe_load_all(text) if doc is not None]
    except yaml.YAMLError as err:
        raise RenderError(f"template {template} produced invalid YAML: {err}") from None
    if len(documents) < 2 or not all(isinstance(doc, dict) for doc in documents):
        raise RenderError(
            f"template {template} must produce a header and task documents (YAML mappings)"
        )
    return documents


def check_shape(spec: JobSpec, documents: list[dict[str, Any]], spot: bool) -> None:
    """The documents are the group mncloud means: header, lighthouse on demand, one
    single-node task per node on the plan's market, with their replica numbers."""
    header, lighthouse, *nodes = documents
    expected = node_tasks(spec.name, spec.nodes)
    names = [doc.get("name") for doc in nodes]
    if header.get("execution") != "parallel" or header.get("primary_tasks") != expected:
        raise RenderError(
            "the job group header must say `execution: parallel` and list the node tasks "
            f"{expected} as primary_tasks"
        )
    if lighthouse.get("name") != lighthouse_task(spec.name) or names != expected:
        raise RenderError(
            f"the job group must hold {lighthouse_task(spec.name)} then {expected}; "
            f"got {[lighthouse.get('name'), *names]}"
        )
    if _asks_spot(lighthouse):
        raise RenderError("the lighthouse task must run on demand: a preemption would end it")
    for k, doc in enumerate(nodes):
        if doc.get("num_nodes", 1) != 1:
            raise RenderError(f"{names[k]} must be a single-node task (num_nodes: 1)")
        if _asks_spot(doc) != spot:
            market = "spot" if spot else "on-demand"
            raise RenderError(
                f"{names[k]} sets use_spot against the plan ({market}); "
                "render `resources` from the template variables"
            )
        envs = doc.get("envs") or {}
        if str(envs.get(constants.REPLICA_ID_ENV)) != str(k):
            raise RenderError(f"{names[k]} must set {constants.REPLICA_ID_ENV}={k}")
        if not envs.get(constants.CKPT_URI_ENV):
            raise RenderError(
                f"{names[k]} must set {constants.CKPT_URI_ENV}: its node finds the lighthouse there"
            )


def _asks_spot(config: dict[str, Any]) -> bool:
    resources = config.get("resources") or {}
    entries = [resources, *resources.get("ordered", []), *resources.get("any_of", [])]
    return any(bool(entry.get("use_spot")) for entry in entries)


def surely_loads(documents: list[dict[str, Any]]) -> bool:
    """True only if SkyPilot's job-group loader surely accepts the header and the task names
    (each task is checked on its own by `render.validate_task_config`)."""
    header, *tasks = documents
    names = [task.get("name") for task in tasks]
    return (
        set(header) <= _HEADER_FIELDS
        and isinstance(header.get("name"), str)
        and bool(_SAFE_NAME.match(header["name"]))
        and header.get("execution") == "parallel"
        and all(isinstance(n, str) and _SAFE_NAME.match(n) for n in names)
        and len(set(names)) == len(names)
        and isinstance(header.get("primary_tasks"), list)
        and set(header["primary_tasks"]) <= set(names)
        and header.get("inter_connection") in (None, True, False)
    )


def load_dag(text: str, secrets: list[tuple[str, str]] | None = None) -> Any:
    """SkyPilot's `Dag` for the group's YAML (`sky.utils.dag_utils.load_job_group_from_yaml_str`),
    secrets given as `secrets_overrides`; RenderError with SkyPilot's message if it refuses."""
    from sky import dag as dag_lib
    from sky import sky_logging
    from sky.utils import dag_utils

    try:
        with sky_logging.silent():  # its "Loaded Job Group …" would land in `render`'s stdout
            dag = dag_utils.load_job_group_from_yaml_str(text, secrets_overrides=secrets or None)
    except Exception as err:  # SkyPilot raises ValueError and its own exception types
        message = " ".join(str(err).split())
        raise RenderError(f"SkyPilot rejects the job group: {message}") from None
    if dag.execution != dag_lib.DagExecution.PARALLEL:
        raise RenderError("SkyPilot does not read the YAML as a job group (execution: parallel)")
    return dag


def validate(documents: list[dict[str, Any]], text: str) -> None:
    """The group as SkyPilot's job-group loader reads it; skipped (no SkyPilot import) when
    `surely_loads` vouches for the header and every task passed its own check."""
    from mncloud.render import schema as taskcheck

    if surely_loads(documents) and all(taskcheck.surely_valid(doc) for doc in documents[1:]):
        return
    load_dag(text)
