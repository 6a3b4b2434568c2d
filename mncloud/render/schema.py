"""A fast answer to "would SkyPilot accept this task?" that never says yes wrongly.

`render.validate_task_config` asks SkyPilot itself (its task schema, then
`sky.Task.from_yaml_config`), which costs a SkyPilot import. `surely_valid` answers True only
when SkyPilot surely accepts the task, with no import:

- SkyPilot's task and resources schemas, cached (`skycache`), validated by the same extended
  Draft 7 validator SkyPilot builds (`case_insensitive_enum`, `case_sensitive_enum`), wherever
  SkyPilot applies them (the task as given and with env values made strings, `resources`, and
  each `ordered`/`any_of` entry merged over it);
- then the checks `from_yaml_config` adds, for the fields mncloud's templates render:
  accelerators SkyPilot's catalog names, positive counts and sizes, env values present, clouds,
  regions and instance types the offers index (`catalog_index`) holds.

Anything else (another field, a form it does not know, a failing check) answers False, and the
caller asks SkyPilot, whose verdict and message stand.
"""

from __future__ import annotations

import re
from typing import Any

from mncloud.catalog import cache as skycache

_TOP_FIELDS = {
    "name", "num_nodes", "workdir", "resources", "envs", "secrets", "setup", "run",
    "api_server_access",
}  # fmt: skip
_ENTRY_FIELDS = {
    "accelerators", "cpus", "use_spot", "infra", "instance_type", "disk_size", "network_tier",
}  # fmt: skip
_RESOURCE_FIELDS = _ENTRY_FIELDS | {"job_recovery", "ordered", "any_of"}
_ACCELERATOR = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)(?::([1-9][0-9]{0,3}))?$")
_CPUS = re.compile(r"^[1-9][0-9]{0,3}\+?$")
_DOCKER_PREFIX = "SKYPILOT_DOCKER"


def schemas() -> dict[str, Any]:
    """SkyPilot's task and resources schemas (`get_task_schema()`, `get_resources_schema()`),
    cached per SkyPilot version: `{"task": ..., "resources": ...}`."""
    return skycache.cached("task-schema.json", lambda: None, _read_schemas)


def _read_schemas() -> dict[str, Any]:
    import json

    from sky.utils import schemas as sky_schemas

    found = {"task": sky_schemas.get_task_schema(), "resources": sky_schemas.get_resources_schema()}
    return json.loads(json.dumps(found))


def surely_valid(config: Any) -> bool:
    """True only if SkyPilot's schema and `Task.from_yaml_config` surely accept `config`."""
    if not skycache.enabled() or not isinstance(config, dict):
        return False
    try:
        return _fields_ok(config) and _schema_ok(config)
    except Exception:  # an unexpected shape: let SkyPilot judge it
        return False


def _schema_ok(config: dict[str, Any]) -> bool:
    """The task schema on the config as given and as `from_yaml_config` re-checks it (env
    values made strings); the resources schema on `resources` and on each merged entry, as
    `Resources.from_yaml_config` checks them."""
    found = schemas()
    task, resources = _validator()(found["task"]), _validator()(found["resources"])
    as_parsed = dict(config)
    if isinstance(config.get("envs"), dict):
        as_parsed["envs"] = {
            str(k): None if v is None else str(v) for k, v in config["envs"].items()
        }
    checks = [(task, config), (task, as_parsed)]
    block = config.get("resources")
    if block:
        checks.append((resources, block))
        parent = {k: v for k, v in block.items() if k not in ("ordered", "any_of")}
        for entry in block.get("ordered") or block.get("any_of") or []:
            checks.append((resources, {**parent, **entry}))
    return all(v.is_valid({k: x for k, x in c.items() if x is not None}) for v, c in checks)


def _validator() -> Any:
    """SkyPilot's validator class (`sky.utils.validator.get_schema_validator`), rebuilt."""
    import jsonschema

    def case_insensitive_enum(validator: Any, enums: Any, instance: Any, schema: Any) -> Any:
        if instance.lower() not in [enum.lower() for enum in enums]:
            yield jsonschema.ValidationError(f"{instance!r} is not one of {enums!r}")

    def case_sensitive_enum(validator: Any, enums: Any, instance: Any, schema: Any) -> Any:
        if instance not in enums:
            yield jsonschema.ValidationError(f"{instance!r} is not one of {enums!r}")

    return jsonschema.validators.extend(
        jsonschema.Draft7Validator,
        validators={
            "case_insensitive_enum": case_insensitive_enum,
            "case_sensitive_enum": case_sensitive_enum,
        },
    )


def _fields_ok(config: dict[str, Any]) -> bool:
    if not set(config) <= _TOP_FIELDS:
        return False
    checks = (
        _optional(config.get("name"), str),
        _optional(config.get("setup"), str),
        _optional(config.get("run"), str),
        _workdir_ok(config.get("workdir")),
        config.get("num_nodes") is None or _positive_int(config["num_nodes"]),
        _envs_ok(config.get("envs")),
        _secrets_ok(config.get("secrets")),
    )
    return all(checks) and _resources_ok(config.get("resources"))


def _optional(value: Any, kind: type) -> bool:
    return value is None or isinstance(value, kind)


def _positive_int(value: Any) -> bool:
    return type(value) is int and value > 0


def _workdir_ok(workdir: Any) -> bool:
    return workdir is None or (isinstance(workdir, str) and "$" not in workdir)


def _envs_ok(envs: Any) -> bool:
    if envs is None:
        return True
    return isinstance(envs, dict) and all(
        isinstance(k, str) and not k.startswith(_DOCKER_PREFIX) and v is not None
        for k, v in envs.items()
    )


def _secrets_ok(secrets: Any) -> bool:
    """Only the form mncloud renders: names with null values (resolved at launch)."""
    if secrets is None:
        return True
    return isinstance(secrets, dict) and all(
        isinstance(k, str) and not k.startswith(("secrets:", _DOCKER_PREFIX)) and v is None
        for k, v in secrets.items()
    )


def _resources_ok(resources: Any) -> bool:
    if resources is None:
        return True
    if not isinstance(resources, dict) or not set(resources) <= _RESOURCE_FIELDS:
        return False
    if "ordered" in resources and "any_of" in resources:
        return False
    recovery = resources.get("job_recovery")
    if recovery is not None and not (
        isinstance(recovery, dict) and _optional(recovery.get("strategy"), str)
    ):
        return False
    parent = {k: v for k, v in resources.items() if k in _ENTRY_FIELDS}
    entries = resources.get("ordered") or resources.get("any_of") or [{}]
    if not isinstance(entries, list):
        return False
    return all(
        isinstance(entry, dict) and set(entry) <= _ENTRY_FIELDS and _entry_ok({**parent, **entry})
        for entry in entries
    )


def _entry_ok(entry: dict[str, Any]) -> bool:
    """One resources entry (the parent's fields with the entry's over them)."""
    from mncloud import catalog

    accelerator = _accelerator(entry.get("accelerators"))
    if accelerator is None:
        return False
    if accelerator and accelerator[0] not in catalog.accelerator_names():
        return False
    cpus = entry.get("cpus")
    if cpus is not None and not (
        _positive_int(cpus) or (isinstance(cpus, str) and _CPUS.match(cpus))
    ):
        return False
    if not _optional(entry.get("use_spot"), bool):
        return False
    if entry.get("network_tier") not in (None, "best", "standard"):
        return False
    disk = entry.get("disk_size")
    if disk is not None and not _positive_int(disk):
        return False
    return _placement_ok(entry.get("infra"), entry.get("instance_type"), accelerator, cpus)


def _accelerator(value: Any) -> tuple[str, int] | tuple[()] | None:
    """`NAME[:N]` parsed; () for none; None for a form left to SkyPilot."""
    if value is None:
        return ()
    if not isinstance(value, str):
        return None
    match = _ACCELERATOR.match(value)
    if match is None or "tpu" in value.lower():
        return None
    return match.group(1), int(match.group(2) or 1)


def _placement_ok(
    infra: Any, instance_type: Any, accelerator: tuple[str, int] | tuple[()], cpus: Any
) -> bool:
    """`cloud`, `cloud/*` or `cloud/region`, and an instance type, checked against the index."""
    from mncloud.catalog import index as catalog_index

    if infra is None:
        return instance_type is None
    if not isinstance(infra, str):
        return False
    cloud, _, region = infra.partition("/")
    if not cloud or cloud != cloud.lower() or "/" in region:
        return False
    region = "" if region == "*" else region
    sections = catalog_index.sections([cloud])
    if sections is None:
        return False
    section = sections[cloud]
    if region and region not in section["regions"]:
        return False
    if instance_type is None:
        return True
    if not isinstance(instance_type, str) or not accelerator or cpus is not None:
        return False
    name, count = accelerator
    return any(
        row.instance_type == instance_type
        and row.accelerator_count == count
        and (not region or row.region == region)
        for row in catalog_index.rows_for(section, name)
    )
