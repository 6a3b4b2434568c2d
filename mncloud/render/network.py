"""The fast network: which resource entries get `network_tier: best`, what env the fabric needs,
and the all-reduce bus bandwidth the preflight should expect.

SkyPilot 0.14.1 treats `network_tier: best` as a *cloud filter* (Lambda, Azure, RunPod… drop
out) and, within a cloud, keeps only the cheapest instance type; so `best` goes on an entry,
never on the task, and only on an entry pinned to an instance type whose fabric SkyPilot enables
that way (`plan/hardware.yaml`, `tier_best`: AWS EFA types, GCP a3-high/edge TCPX, Nebius IB).
An entry without an instance type (`render --cloud aws`, no plan) is split into one pinned entry
per catalog instance type with such a fabric, plus the plain entry when the cloud also has
others. Single-node, CPU and local tasks and `--network standard` are left as they are.

AWS EFA: SkyPilot sets no libfabric/NCCL variables on VMs, so `FI_PROVIDER=efa` and friends are
rendered (task-wide; unused elsewhere). It attaches every EFA card only when the user's SkyPilot
config has `aws.use_internal_ips` (which needs SSM or an SSH proxy, so mncloud cannot set it
for them: a task's `config:` may not override it); without it one card of a p5's 32 is used,
and the expectation is priced at that rate. (notes/network-and-step-time.md §1.)
"""

from __future__ import annotations

from typing import Any

from mncloud.catalog import skyconfig
from mncloud.errors import SpecError
from mncloud.plan import hardware
from mncloud.spec import JobSpec, NetworkTier

#: What aws-ofi-nccl needs on a SkyPilot AWS VM (SkyPilot sets it only on Kubernetes).
EFA_ENV = {"FI_PROVIDER": "efa", "FI_EFA_USE_DEVICE_RDMA": "1", "FI_EFA_FORK_SAFE": "1"}


def applies(spec: JobSpec) -> bool:
    """Whether the task may ask for a fast fabric: 2+ GPU nodes on a cloud, `--network best`."""
    return (
        spec.nodes > 1
        and not spec.is_local
        and not spec.accelerator.is_cpu
        and spec.network is NetworkTier.BEST
    )


def _cloud(entry: dict[str, Any]) -> str:
    return str(entry.get("infra", "")).split("/", 1)[0].lower()


def _fast(cloud: str, instance_type: str) -> bool:
    return hardware.network(cloud, instance_type).fabric.tier_best


def with_tiers(spec: JobSpec, choices: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The resource entries, with `network_tier: best` on each one whose fabric needs it."""
    if not applies(spec):
        return choices
    out: list[dict[str, Any]] = []
    for entry in choices:
        cloud, pinned = _cloud(entry), entry.get("instance_type")
        if pinned:
            fast = _fast(cloud, str(pinned))
            out.append({**entry, "network_tier": "best"} if fast else entry)
            continue
        types = _instance_types(spec, cloud, entry)
        fast_types = [t for t in types if _fast(cloud, t)]
        out += [{**entry, "instance_type": t, "network_tier": "best"} for t in fast_types]
        if len(fast_types) < len(types) or not types:
            out.append(entry)
    return out


def _instance_types(spec: JobSpec, cloud: str, entry: dict[str, Any]) -> list[str]:
    """The catalog's instance types with the task's GPUs on `cloud` (in the entry's region)."""
    from mncloud import catalog
    from mncloud.errors import CatalogError

    if not cloud:
        return []
    region = str(entry.get("infra", "")).partition("/")[2]
    regions = [region] if region and region != "*" else []
    name, _, count = str(entry.get("accelerators") or spec.accelerator).partition(":")
    try:
        search = catalog.offers(
            name,
            int(count or 1),
            clouds=[cloud],
            regions=regions,
            nodes=spec.nodes,
        )
    except CatalogError:
        return []
    return sorted({offer.instance_type for offer in search.offers})


def fabric_env(spec: JobSpec, choices: list[dict[str, Any]]) -> dict[str, str]:
    """Variables the chosen fabrics need (the user's `--env` wins)."""
    env: dict[str, str] = {}
    for entry in choices:
        if entry.get("network_tier") == "best" and _network(entry).fabric.key == "efa":
            env.update(EFA_ENV)
    return {k: v for k, v in env.items() if k not in spec.envs}


def _network(entry: dict[str, Any]) -> hardware.Network:
    return hardware.network(_cloud(entry), str(entry.get("instance_type") or ""))


def require_preflight(spec: JobSpec) -> None:
    """SpecError when `--min-bandwidth` is given with `--no-preflight`: no test would hold the
    fabric to it, and a floor must never be ignored silently."""
    if spec.min_bandwidth is not None and not spec.preflight:
        raise SpecError(
            f"--min-bandwidth {spec.min_bandwidth:g} is checked by the preflight's bandwidth "
            "test; drop --no-preflight (or --min-bandwidth)"
        )


def expected_busbw(spec: JobSpec, choices: list[dict[str, Any]]) -> tuple[float, str] | None:
    """The all-reduce bus bandwidth (GB/s) the preflight expects between nodes, and a word on
    why: the first entry's (the plan's choice) at the rate it will really get between the run's
    node count (a fabric's efficiency falls from 2 nodes to 8+); None for one node.

    The preflight runs one rank per node, so a fabric with a rail per GPU (EFA, TCPX, IB) is
    expected to give that rank its share of the node's rate; TCP and loopback give it all.
    """
    if spec.nodes < 2:
        return None
    if spec.is_local:
        local = hardware.network("local", "*")
        return local.busbw_gbs(enabled=True, nodes=spec.nodes), local.fabric.name
    if not choices or not choices[0].get("instance_type"):
        return None
    entry = choices[0]
    net = _network(entry)
    enabled = entry.get("network_tier") == "best" or not net.fabric.tier_best
    all_cards = net.fabric.key != "efa" or net.cards == 1 or skyconfig.aws_all_efa_cards()
    busbw = net.busbw_gbs(enabled=enabled, all_cards=all_cards, nodes=spec.nodes)
    railed = enabled and all_cards and net.fabric.key not in ("tcp", "loopback")
    if railed and spec.accelerator.count > 1:
        busbw /= spec.accelerator.count
    fabric = net.fabric.name if enabled else "standard TCP"
    if net.fabric.key == "efa" and enabled and not all_cards:
        fabric += f", 1 of {net.cards} cards (aws.use_internal_ips is off)"
    return busbw, f"{entry['instance_type']}: {fabric}"
