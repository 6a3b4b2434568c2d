"""Hardware facts from `hardware.yaml`: each GPU's peak FLOP/s and memory, each offer's network.

Data, not code: the YAML beside this module holds every figure with its public source; this
module only reads and validates it (once per process) and answers three questions:

- `gpu(name, cloud, instance_type)`: the GPU's facts, under the catalog's accelerator name
  (an instance row may name the variant the catalog hides, e.g. Lambda's H100 PCIe);
- `network(cloud, instance_type)`: the inter-node fabric, its nominal Gbps per node and whether
  SkyPilot enables it only with `network_tier: best` (first matching instance row, else the
  stated default);
- `model()`: the step-time model's stated defaults (MFU, overlap, headroom).
"""

from __future__ import annotations

import fnmatch
import math
from functools import cache
from importlib import resources
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from mncloud.errors import CatalogError

DTYPES = ("bf16", "fp16", "tf32", "fp32")


class GpuFacts(BaseModel):
    """One accelerator's datasheet figures."""

    model_config = ConfigDict(frozen=True)

    name: str
    variant: str
    peak_tflops: dict[str, float]
    """Dense tensor-core TFLOPS by dtype (`bf16`, `fp16`, `tf32`, `fp32`)."""
    memory_gb: float = Field(gt=0)
    memory_bw_tbs: float = Field(gt=0)
    nvlink_gbs: float | None = None
    """NVLink GB/s per GPU (both directions); None: the node's GPUs talk over PCIe."""
    pcie_gbs: float = 32.0
    """PCIe GB/s one direction (Gen4 x16 32, Gen5 64), for GPUs without NVLink."""
    matmul_fraction: float = Field(0.8, gt=0, le=1)
    """The best matmul's share of peak (MAMF): the ceiling any MFU stays under."""
    efficiency: float | None = Field(None, gt=0, le=1)
    """The MFU (bf16, 6·params + attention FLOPs per token) published runs of the same code
    reach on this GPU; None: no table, the model's stated default."""
    efficiency_source: str = ""
    source: str

    def peak_flops(self, dtype: str = "bf16") -> float:
        """Peak FLOP/s in `dtype`; a GPU without bf16 (V100, T4) answers with fp16."""
        if dtype == "bf16" and "bf16" not in self.peak_tflops:
            dtype = "fp16"
        if dtype not in self.peak_tflops:
            raise CatalogError(f"hardware.yaml lists no {dtype} peak for {self.name}")
        return self.peak_tflops[dtype] * 1e12


class Fabric(BaseModel):
    """An inter-node network kind."""

    model_config = ConfigDict(frozen=True)

    key: str
    name: str
    achievable: float = Field(gt=0, le=1)
    """Fraction of the nominal rate an all-reduce's bus bandwidth reaches at 8 nodes or more."""
    achievable_2: float | None = Field(None, gt=0, le=1)
    """The same at 2 nodes (None: as at 8+); between 2 and 8 nodes, log-linear."""
    tier_best: bool
    """SkyPilot enables it only with `network_tier: best` on the offer."""
    source: str

    def achievable_at(self, nodes: int) -> float:
        """The achievable fraction at `nodes` nodes: `achievable_2` at 2, `achievable` from 8."""
        if self.achievable_2 is None or nodes >= 8:
            return self.achievable
        t = (math.log2(max(nodes, 2)) - 1) / 2
        return self.achievable_2 + t * (self.achievable - self.achievable_2)

    def rescale(self, busbw_gbs: float, measured_nodes: int, nodes: int) -> float:
        """A bus bandwidth measured between `measured_nodes` nodes, as `nodes` would get it."""
        return busbw_gbs * self.achievable_at(nodes) / self.achievable_at(measured_nodes)


class Network(BaseModel):
    """One offer's inter-node network: its fabric and nominal rate per node."""

    model_config = ConfigDict(frozen=True)

    fabric: Fabric
    gbps: float = Field(gt=0)
    """Nominal Gbit/s per node once the fabric is enabled."""
    standard_gbps: float | None = None
    """Gbit/s without the fabric (its ordinary NIC); None: the same as `gbps` for TCP."""
    cards: int = 1
    """EFA network cards (SkyPilot attaches one unless `aws.use_internal_ips` is set)."""
    gpu: str | None = None
    """The GPU variant this instance type has where the catalog's name hides it."""
    source: str
    known: bool = True
    """False: no row names the instance type; `gbps` is the stated default."""

    def rate_gbps(self, *, enabled: bool, all_cards: bool = True) -> float:
        """Nominal Gbit/s per node the run gets: the fabric's when `enabled` (EFA: one card of
        `cards` unless `all_cards`), else the ordinary NIC's."""
        if not enabled and self.fabric.key != "tcp":
            return self.standard_gbps or min(self.gbps, 100.0)
        if self.fabric.key == "efa" and not all_cards:
            return self.gbps / self.cards
        return self.gbps

    def busbw_gbs(self, *, enabled: bool, all_cards: bool = True, nodes: int = 8) -> float:
        """Expected all-reduce bus bandwidth between `nodes` nodes, GB/s: the rate × the
        achievable fraction of its fabric there (ordinary TCP's when it is not enabled)."""
        used = self.fabric if enabled else fabric("tcp")
        achievable = used.achievable_at(nodes)
        return self.rate_gbps(enabled=enabled, all_cards=all_cards) / 8 * achievable


class ModelDefaults(BaseModel):
    """The step-time model's stated assumptions (each with its source in the YAML)."""

    model_config = ConfigDict(frozen=True)

    mfu: float = Field(gt=0, le=1)
    recompute_time_share: float = Field(ge=0, le=1)
    overlap: float = Field(ge=0, le=1)
    backward_share: float = Field(gt=0, lt=1)
    intra_node_achievable: float = Field(gt=0, le=1)
    memory_headroom: float = Field(gt=0, le=1)


class _InstanceRow(BaseModel):
    cloud: str
    instance_type: str
    fabric: str
    gbps: float
    standard_gbps: float | None = None
    cards: int = 1
    gpu: str | None = None
    source: str


class Facts(BaseModel):
    """The whole data file, validated."""

    gpus: dict[str, GpuFacts]
    fabrics: dict[str, Fabric]
    instances: list[_InstanceRow]
    default_network: dict[str, Any]
    model: ModelDefaults

    @model_validator(mode="before")
    @classmethod
    def _resolve(cls, data: dict[str, Any]) -> dict[str, Any]:
        gpus = {}
        for name, row in data["gpus"].items():
            base = dict(data["gpus"][row["same_as"]]) if "same_as" in row else {}
            base.update({k: v for k, v in row.items() if k != "same_as"})
            gpus[name] = {**base, "name": name}
        fabrics = {k: {**v, "key": k} for k, v in data["fabrics"].items()}
        return {**data, "gpus": gpus, "fabrics": fabrics}

    @model_validator(mode="after")
    def _fabrics_known(self) -> Facts:
        default = _InstanceRow(**self.default_network, cloud="", instance_type="default")
        for row in [*self.instances, default]:
            if row.fabric not in self.fabrics:
                raise ValueError(f"row {row.instance_type!r}: unknown fabric {row.fabric!r}")
            if row.gpu is not None and row.gpu not in self.gpus:
                raise ValueError(f"row {row.instance_type!r}: unknown gpu {row.gpu!r}")
        return self


@cache
def facts() -> Facts:
    """The data file, read and validated once per process."""
    text = resources.files("mncloud.plan").joinpath("hardware.yaml").read_text()
    try:
        return Facts.model_validate(yaml.safe_load(text))
    except (ValidationError, KeyError, TypeError) as err:  # a packaging defect, not user input
        raise CatalogError(f"mncloud/plan/hardware.yaml is malformed: {err}") from None


def model() -> ModelDefaults:
    return facts().model


def fabric(key: str) -> Fabric:
    return facts().fabrics[key]


def network(cloud: str, instance_type: str) -> Network:
    """The offer's inter-node network: the first instance row that matches, else the default."""
    data = facts()
    for row in data.instances:
        if row.cloud == cloud.lower() and fnmatch.fnmatchcase(instance_type, row.instance_type):
            fields = row.model_dump(exclude={"cloud", "instance_type", "fabric"})
            return Network(fabric=data.fabrics[row.fabric], **fields)
    default = data.default_network
    return Network(
        fabric=data.fabrics[default["fabric"]],
        gbps=default["gbps"],
        source=default["source"],
        known=False,
    )


def gpu(name: str, cloud: str | None = None, instance_type: str | None = None) -> GpuFacts | None:
    """The GPU's facts (the instance row's variant first), or None when the file has none."""
    data = facts()
    if cloud and instance_type:
        variant = network(cloud, instance_type).gpu
        if variant is not None:
            return data.gpus[variant]
    by_lower = {k.lower(): v for k, v in data.gpus.items()}
    return by_lower.get(name.lower())


def gpu_for_device(device: str) -> GpuFacts | None:
    """The data file's GPU for a CUDA device name (`NVIDIA H100 80GB HBM3`), or None (a CPU).

    The longest accelerator name found in the device name wins; PCIe and 80 GB variants are
    told apart by the words the driver reports (`H100 PCIe`, `A100-SXM4-80GB`).
    """
    text = device.lower().replace(" ", "-")
    if text == "cpu":
        return None
    data = facts()
    names = sorted(data.gpus, key=len, reverse=True)
    found = next((n for n in names if n.lower().split("-")[0] in text), None)
    if found is None:
        return None
    base = found.split("-")[0]
    if "pcie" in text and f"{base}-PCIe" in data.gpus:
        return data.gpus[f"{base}-PCIe"]
    if "80gb" in text and f"{base}-80GB" in data.gpus:
        return data.gpus[f"{base}-80GB"]
    return data.gpus[base] if base in data.gpus else data.gpus[found]
