"""`--dryrun`: SkyPilot's own dry run in-process, or what can be checked without credentials.

`sky.execution.launch(dryrun=True)` runs SkyPilot's optimizer and provisioner: they pick a
region and write the provisioning config, nothing is created and no API server is needed.
`sky jobs launch` has no dry run; this checks the cluster the jobs controller would launch for
the managed job (every cloud run is one, spot or on-demand).
"""

from __future__ import annotations

import contextlib
import json
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from mncloud.backends.base import RunState, RunStatus
from mncloud.backends.skypilot.errors import sky_errors
from mncloud.backends.skypilot.meta import BACKEND_NAME

#: The EFA AMI the dry run writes: SkyPilot finds the real one by name (EC2) at launch.
EFA_AMI_STAND_IN = "ami-00000000efadry0un"

if TYPE_CHECKING:
    import sky

    from mncloud.plan import Plan
    from mncloud.spec import JobSpec


def dryrun(task: sky.Task, spec: JobSpec, plan: Plan | None, spot: bool) -> RunStatus:
    """Dry-run the launch of `task`; what SkyPilot would launch, and where."""
    from sky import exceptions as sx
    from sky import execution, sky_logging

    try:
        with (
            sky_errors(f"dry-run {spec.name}", keep=(sx.NoCloudAccessError,)),
            sky_logging.silent(),
            off_stdout(),
            efa_cards_offline(),
        ):
            execution.launch(
                task,
                cluster_name=spec.name,
                dryrun=True,
                down=False,
                stream_logs=False,
                _quiet_optimizer=True,
            )
    except sx.NoCloudAccessError:
        return dryrun_without_credentials(spec, plan, spot)
    chosen = dryrun_choice(spec.name)
    what = f"a managed {'spot' if spot else 'on-demand'} job"
    where = "/".join(v for v in (chosen.get("cloud"), chosen.get("region")) if v)
    node = chosen.get("instance_type") or "?"
    detail = f"dry run passed: SkyPilot would launch {spec.nodes}× {node} in {where or '?'} "
    detail += f"as {what}; nothing was provisioned"
    if plan is not None and chosen.get("region") and chosen["region"] != plan.choice.region:
        detail += (
            f" (the plan's first choice {plan.choice.where} was passed over by SkyPilot; "
            "see `sky launch --dryrun` for why)"
        )
    return _dryrun_status(spec, plan, spot, detail, **_placement(chosen))


@contextlib.contextmanager
def off_stdout() -> Iterator[None]:
    """SkyPilot's spinner writes terminal codes to stdout even when silent (`\x1b[?25h`): sent
    to stderr during its dry run, so stdout holds only what `up` prints (the task, `--json`)."""
    with contextlib.redirect_stdout(sys.stderr):
        yield


@contextlib.contextmanager
def efa_cards_offline() -> Iterator[None]:
    """Keep SkyPilot's dry run of a `network_tier: best` AWS entry offline: its two EC2 calls
    are answered here, during the dry run only (a launch asks EC2). The EFA card count comes
    from `plan/hardware.yaml` (the counts SkyPilot's aws_efa README lists); the EFA AMI (SkyPilot
    looks up its Deep Learning Base OSS AMI by name) is `EFA_AMI_STAND_IN` in the dry run."""
    from sky.clouds import aws as sky_aws

    from mncloud.plan import hardware

    def cards(instance_type: str, region_name: str) -> int:
        net = hardware.network("aws", instance_type)
        return net.cards if net.fabric.key == "efa" else 0

    def no_efa_image(region_name: str) -> str:
        return EFA_AMI_STAND_IN

    asked = sky_aws._get_max_efa_interfaces, sky_aws._get_efa_image_id
    sky_aws._get_max_efa_interfaces, sky_aws._get_efa_image_id = cards, no_efa_image
    try:
        yield
    finally:
        sky_aws._get_max_efa_interfaces, sky_aws._get_efa_image_id = asked


def dryrun_job_group(dag: sky.Dag, spec: JobSpec, plan: Plan | None, spot: bool) -> RunStatus:
    """Dry-run a job group (`--recovery node`): SkyPilot's dry run of the lighthouse and a node
    task, then its placement of the whole group (`dryrun_group`)."""
    from sky import exceptions as sx

    try:
        with sky_errors(f"dry-run {spec.name}", keep=(sx.NoCloudAccessError,)):
            detail, chosen = dryrun_group(dag, spec.name, spec.nodes, spot)
    except sx.NoCloudAccessError:
        return dryrun_without_credentials(spec, plan, spot)
    return _dryrun_status(spec, plan, spot, detail, **_placement(chosen))


def _placement(chosen: dict[str, Any]) -> dict[str, Any]:
    """Where SkyPilot's dry run placed the task: cloud, region and instance type."""
    return {key: chosen.get(key) for key in ("cloud", "region", "instance_type")}


def dryrun_without_credentials(spec: JobSpec, plan: Plan | None, spot: bool) -> RunStatus:
    """What a dry run can check with no cloud credentials: the plan (from the catalog)
    and the task (SkyPilot's schema and parser); SkyPilot's optimizer needs `sky check`."""
    choice = plan.choice if plan is not None else None
    where = f"{choice.instance_type} in {choice.cloud}/{choice.region}" if choice else "?"
    clouds = (
        " or ".join(dict.fromkeys(c.cloud for c in [plan.choice, *plan.fallbacks])) if plan else ""
    )
    detail = (
        f"dry run: plan and task are valid ({spec.nodes}× {where}, "
        f"{'spot' if spot else 'on-demand'}); SkyPilot's own dry run needs credentials for "
        f"{clouds or 'a cloud'}: set them up and run `sky check`; nothing was provisioned"
    )
    return _dryrun_status(
        spec,
        plan,
        spot,
        detail,
        cloud=choice.cloud if choice else None,
        region=choice.region if choice else None,
        instance_type=choice.instance_type if choice else None,
    )


def _dryrun_status(
    spec: JobSpec,
    plan: Plan | None,
    spot: bool,
    detail: str,
    *,
    cloud: str | None,
    region: str | None,
    instance_type: str | None,
) -> RunStatus:
    return RunStatus(
        name=spec.name,
        backend=BACKEND_NAME,
        state=RunState.PENDING,
        nodes=spec.nodes,
        cloud=cloud,
        region=region,
        instance_type=instance_type,
        spot=spot,
        hourly_total=plan.choice.hourly_total if plan is not None else None,
        ckpt_uri=spec.ckpt_uri,
        detail=detail,
    )


def dryrun_choice(cluster_name: str) -> dict[str, str]:
    """Cloud, region and instance type from the provisioning config SkyPilot's dry run wrote."""
    from sky.backends import backend_utils

    try:
        path = Path(backend_utils._get_yaml_path_from_cluster_name(cluster_name) + ".tmp")
        config = yaml.safe_load(path.read_text())
    except (OSError, AttributeError, yaml.YAMLError):  # a private SkyPilot path: best effort
        return {}
    provider = config.get("provider") or {}
    module = str(provider.get("module") or provider.get("type") or "")
    cloud = module.rsplit(".", 1)[-1] if "." in module else None
    chosen = {"cloud": {"lambda_cloud": "lambda"}.get(cloud or "", cloud)}
    chosen["region"] = provider.get("region")
    text = json.dumps(config.get("available_node_types") or {})
    found = re.search(r'"(?:InstanceType|machineType|instance_type)": "([^"/]+)"', text)
    chosen["instance_type"] = found.group(1) if found else None
    return {k: v for k, v in chosen.items() if v}


def dryrun_group(dag: sky.Dag, name: str, nodes: int, spot: bool) -> tuple[str, dict[str, str]]:
    """SkyPilot's dry run of each distinct task (the lighthouse and node 0: the other node
    tasks differ only in their envs), then SkyPilot's placement of the whole group
    (`Optimizer.optimize_job_group`, in-process). Returns the detail line and node 0's
    cloud/region/instance type; BackendError when SkyPilot could not place the group."""
    from sky import exceptions as sx
    from sky import execution, sky_logging
    from sky import optimizer as sky_optimizer

    lighthouse, node0 = dag.tasks[0], dag.tasks[1]
    chosen: dict[str, str] = {}
    keep = (sx.NoCloudAccessError,)  # no credentials: the caller shows what it can check
    for task in (lighthouse, node0):
        with (
            sky_errors(f"dry-run {task.name}", keep),
            sky_logging.silent(),
            off_stdout(),
            efa_cards_offline(),
        ):
            execution.launch(
                _fresh(task),
                cluster_name=task.name,
                dryrun=True,
                down=False,
                stream_logs=False,
                _quiet_optimizer=True,
            )
        chosen[str(task.name)] = dryrun_choice(str(task.name))
    with sky_errors(f"place job group {name}"), sky_logging.silent(), off_stdout():
        sky_optimizer.Optimizer.optimize_job_group(dag, quiet=True)
    node_choice = chosen[str(node0.name)]
    where = "/".join(v for v in (node_choice.get("cloud"), node_choice.get("region")) if v)
    best = node0.best_resources
    if best is not None and best.cloud is not None:
        where = f"{str(best.cloud).lower()}/{best.region}"
    # The lighthouse's own dry run may pick another cloud's VM; the group's placement puts it
    # beside the nodes, so its instance type is the placed one's where SkyPilot says.
    placed = lighthouse.best_resources
    beacon = getattr(placed, "instance_type", None) or chosen[str(lighthouse.name)].get(
        "instance_type"
    )
    market = "spot" if spot else "on-demand"
    detail = (
        f"dry run passed: SkyPilot would launch a job group of {nodes} single-node {market} "
        f"tasks ({node_choice.get('instance_type') or '?'}) and an on-demand lighthouse "
        f"({beacon or '?'}) in {where or '?'}; nothing was provisioned"
    )
    return detail, node_choice


def _fresh(task: sky.Task) -> sky.Task:
    """A copy of `task` for a dry run (a launch changes the task it is given)."""
    import sky

    return sky.Task.from_yaml_config(task.to_yaml_config())
