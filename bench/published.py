"""Predicted / published step time for published training runs (issue #44).

    .venv/bin/python bench/published.py [--markdown]

Each run of `tests/data/published_runs.yaml` (its source named per row) is described to the
planner's step-time model as `plan` flags would describe it (parameters, layers, hidden, sequence
length, tokens per GPU per step, micro-batches, recomputation, parallelism) on the GPU and
fabric the source states; the ratio is the model's step over the published one. No GPU is
needed: the published figures are the measurement. `tests/test_plan_steps.py` asserts the
ratios; docs/benchmarks.md shows the table.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path
from typing import Any, NamedTuple

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mncloud.plan import hardware
from mncloud.plan.stepmodel import StepTime, Workload, attention_flops_per_token, step_time
from mncloud.spec import Parallel

RUNS = Path(__file__).resolve().parents[1] / "tests" / "data" / "published_runs.yaml"
#: The fabric the published clusters had (llm-foundry: "1600 Gbps RoCE"; its H100 rows name none).
FABRIC = "infiniband"


class Compared(NamedTuple):
    run: dict[str, Any]
    predicted: StepTime
    published_s: float

    @property
    def ratio(self) -> float:
        return self.predicted.step_seconds / self.published_s


def runs() -> list[dict[str, Any]]:
    return list(yaml.safe_load(RUNS.read_text())["runs"])


def workload(run: dict[str, Any]) -> Workload:
    """The run as `plan --params … --seq-len … --layers … --hidden …` describes it."""
    n, tokens = float(run["params"]), float(run["tokens_per_gpu"])
    per_token = 6 * n + attention_flops_per_token(run["layers"], run["hidden"], run["seq_len"])
    return Workload(
        flops_per_step=per_token * tokens,
        grad_bytes=4 * n,
        weight_bytes=4 * n,
        optimizer_bytes=8 * n,
        params=n,
        layers=run["layers"],
        hidden=run["hidden"],
        seq_len=run["seq_len"],
        tokens_per_step=tokens,
        micro_batches=run["micro_batches"],
        recompute=run["recompute"],
    )


def compare(run: dict[str, Any]) -> Compared:
    """The model's step for one published run, beside the published step."""
    gpu = hardware.gpu(run["gpu"])
    assert gpu is not None, run["gpu"]
    busbw = None
    if run["fabric_gbps"]:
        busbw = run["fabric_gbps"] / 8 * hardware.fabric(FABRIC).achievable_at(run["nodes"])
    step = step_time(
        workload(run),
        gpu,
        gpus_per_node=run["gpus_per_node"],
        nodes=run["nodes"],
        inter_busbw_gbs=busbw,
        parallel=Parallel(run["parallel"]),
        recompute=run["recompute"],
    )
    published = run.get("published_step_s") or run["tokens_per_gpu"] / run["tokens_per_s_per_gpu"]
    return Compared(run, step, float(published))


def markdown(rows: list[Compared]) -> str:
    lines = [
        "| run | GPUs | parallel, recompute | published s | predicted s | ratio |",
        "|---|---|---|---:|---:|---:|",
    ]
    for c in rows:
        r = c.run
        gpus = f"{r['nodes']} × {r['gpu']}:{r['gpus_per_node']}"
        lines.append(
            f"| {r['name']} | {gpus} | {r['parallel'].upper()}, {r['recompute']} | "
            f"{c.published_s:,.3g} | {c.predicted.step_seconds:,.3g} | {c.ratio:.2f} |"
        )
    lines.append(f"\nmedian ratio {statistics.median(c.ratio for c in rows):.2f}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--markdown", action="store_true")
    args = parser.parse_args()
    rows = [compare(run) for run in runs()]
    if args.markdown:
        print(markdown(rows))
        return
    for c in rows:
        print(f"{c.ratio:5.2f}  {c.run['name']} ({c.run['gpu']})")


if __name__ == "__main__":
    main()
