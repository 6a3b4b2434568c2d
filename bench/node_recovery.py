"""bench/node_recovery: the same three preemptions under gang and under node recovery.

    .venv/bin/python bench/node_recovery.py [--provision-delay 10s] [--steps 20000] [--nodes 3]
                                            [--compute-ms 0] [--json]

Launches `examples/train_ddp.py` on the local backend, 3 nodes × 1 process (`cpu:1`, so the
2-core machine is not oversubscribed; `--nodes` for more), checkpoint every 100 steps, twice:
`--recovery gang` (the baseline) and `--recovery node`, with the same modeled
`--provision-delay` and the same three SIGKILLs (node 1, node 2, node 1 again) at 15 %, 40 %
and 65 % of the steps, each once the run is whole again after the previous one (else a second
loss during a replacement would be two at once: a gang relaunch). Reports per run:

- node-seconds lost per preemption: N × the training span (first step to last) less the
  replica-steps kept × the run's own seconds per step (the median gap between steps), divided
  by 3. Each run is measured against its own speed, so a busy machine moves both alike. Under
  gang it is the relaunch and the steps done again; under node, the replaced node's absence and
  any stall of the survivors. Goal: node ≤ 0.25 × gang (the floor is about 1/N: the replaced
  node is out for the provisioning the whole gang is out for);
- steps trained twice: gang, steps rank 0 reported more than once; node, the steps a survivor
  tried and did not commit (the all-reduce that met the dead peer). Goal: node ≤ 1 per
  preemption;
- kill → training again whole: gang, rank 0's first step after the relaunch; node, the
  replacement's first step or heal (the survivors never stopped).

`--compute-ms` makes each step wait that long as for an accelerator, with the CPU free: on a
GPU node the host mostly waits, and a replacement's cold start on its own VM takes nothing from
the survivors; on this 2-core machine, with CPU-bound steps (0, the default), it does.

The provisioning delay is a model of a cloud's (a laptop cannot show a VM's minutes); the
figures compare the two recoveries under the same model, on the same machine, in one run.
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
from pathlib import Path
from typing import Any

from _local import EXAMPLE, fresh_home, mncloud, progress_lines, wait

INTERVAL, KILLS = 100, ((0.15, 1), (0.40, 2), (0.65, 1))


def launch(
    name: str, recovery: str, delay: str, steps: int, nodes: int, compute_ms: float = 0.0
) -> None:
    mncloud("up", str(EXAMPLE), "--cloud", "local", "--nodes", str(nodes), "--gpus", "cpu:1",
            "--name", name, "--detach", "--yes", "--recovery", recovery,
            "--provision-delay", delay, "--max-restarts", "10", "--",
            "--steps", str(steps), "--ckpt-interval", str(INTERVAL),
            "--log-every", str(steps), "--compute-ms", str(compute_ms))  # fmt: skip


def _progress(folder: Path) -> list[dict[str, Any]]:
    return progress_lines(folder)


def _steps(folder: Path, after: float = 0.0) -> list[dict[str, Any]]:
    return [r for r in _progress(folder) if "event" not in r and r["t"] > after]


def _events(folder: Path, kind: str, after: float) -> list[Any]:
    return [e for e in _state(folder).events if e.kind == kind and e.t > after]


def _trains_again(folder: Path, node: int, since: float) -> float | None:
    """When the run trained again after the kill at `since`: gang, rank 0's first step after
    the relaunch; node, the replacement's first step (or its heal); None until then."""
    relaunch = _events(folder, "launch", since) or _events(folder, "node-start", since)
    if not relaunch:
        return None if not _ended(folder) else float("nan")
    after = [r for r in _steps(folder, relaunch[0].t) if r.get("node", node) == node]
    healed = [e.t for e in _events(folder, "node-healed", relaunch[0].t) if e.node == node]
    firsts = [r["t"] for r in after[:1]] + healed[:1]
    if firsts:
        return min(firsts)
    return float("nan") if _ended(folder) else None  # the run ended first: no figure


def _ended(folder: Path) -> bool:
    return bool(_state(folder).state.is_final)


def _preempt(folder: Path, steps: int) -> tuple[list[float], list[float]]:
    """The three kills, each once the run is whole again and past its step; the kill times and
    the times the run trained again after each."""
    from mncloud.backends.local.chaos import preempt_node

    kills: list[float] = []
    back: list[float] = []
    for fraction, node in KILLS:
        at = int(steps * fraction)
        since = back[-1] if back else 0.0

        def past(at: int = at, since: float = since) -> bool:
            return any(r["step"] >= at for r in _steps(folder, since))

        wait(past, 900, f"step {at}")
        kills.append(preempt_node(folder, node, by="bench")["t"])
        back.append(wait(lambda n=node: _trains_again(folder, n, kills[-1]), 900, "recovery"))
        if back[-1] != back[-1]:  # nan: the run ended before it was whole again
            break
    return kills, back


def _step_s(lines: list[dict[str, Any]]) -> float:
    """The run's own seconds per step undisturbed: the median gap between consecutive steps
    of one node (the relaunches' and replacements' gaps are too few to move the median)."""
    first = [r for r in lines if r.get("node", 0) == 0]
    gaps = [b["t"] - a["t"] for a, b in itertools.pairwise(first) if b["step"] > a["step"]]
    return statistics.median(gaps) if gaps else float("nan")


def _figures(folder: Path, kills: list[float], back: list[float], steps: int, nodes: int) -> dict:
    lines = _steps(folder)
    from mncloud.backends.local.state import load_launch

    node_mode = load_launch(folder).recovery == "node"
    if node_mode:
        trained = sum(len({r["step"] for r in lines if r["node"] == n}) for n in range(nodes))
        retries = [r for r in _progress(folder) if r.get("event") == "retry" and r["t"] > kills[0]]
        twice = len({r["step"] for r in retries})  # every survivor redoes the same step
    else:
        trained = nodes * steps
        twice = len(lines) - len({r["step"] for r in lines})
    done = [r["weights_sha256"] for r in _progress(folder) if r.get("event") == "done"]
    step_s = _step_s(lines)
    span = max(r["t"] for r in lines) - min(r["t"] for r in lines)
    lost = nodes * span - trained * step_s  # node-seconds that trained nothing kept
    return {
        "state": _state(folder).state.value,
        "train_span_s": round(span, 1),
        "step_s": round(step_s, 4),
        "node_s_lost_per_preemption": round(lost / len(kills), 1),
        "replica_steps_not_trained": nodes * steps - trained,
        "steps_trained_twice": twice,
        "replicas_end_equal": len(set(done)) == 1,
        "kill_to_replacement_first_step_s": [
            round(b - k, 1) for k, b in zip(kills, back, strict=True)
        ],
    }


def _state(folder: Path) -> Any:
    from mncloud.backends.local.state import load_state

    return load_state(folder)


def main() -> None:
    p = argparse.ArgumentParser(description="Gang vs node recovery under the same preemptions.")
    p.add_argument("--provision-delay", default="10s")
    p.add_argument("--steps", type=int, default=20000)
    p.add_argument("--nodes", type=int, default=3, help="nodes of one process each (≥ 3)")
    p.add_argument(
        "--compute-ms",
        type=float,
        default=0.0,
        help="per step, time the host waits as for a GPU (free CPU): 0 is CPU-bound training",
    )
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    fresh_home()
    from mncloud.backends.local.state import load_state
    from mncloud.layout import run_dir

    def final(name: str):  # type: ignore[no-untyped-def]
        return wait(lambda: (s := load_state(run_dir(name))).state.is_final and s, 1800, name)

    result: dict[str, Any] = {
        "provision_delay": args.provision_delay, "steps": args.steps, "nodes": args.nodes,
        "compute_ms": args.compute_ms,
    }  # fmt: skip
    for recovery in ("gang", "node"):
        launch(recovery, recovery, args.provision_delay, args.steps, args.nodes, args.compute_ms)
        kills, back = _preempt(run_dir(recovery), args.steps)
        final(recovery)
        result[recovery] = _figures(run_dir(recovery), kills, back, args.steps, args.nodes)
    gang, node = result["gang"]["node_s_lost_per_preemption"], result["node"]
    result["node_vs_gang_lost"] = round(node["node_s_lost_per_preemption"] / gang, 3)
    _print(result, args.json)


def _print(result: dict, as_json: bool) -> None:
    if as_json:
        print(json.dumps(result, indent=2))
        return
    print(f"{result['steps']} steps, {result['nodes']} nodes × 1 process, 3 preemptions; "
          f"provisioning modeled as {result['provision_delay']}; "
          f"{result['compute_ms']:g} ms of modeled accelerator time per step")  # fmt: skip
    for mode in ("gang", "node"):
        r = result[mode]
        print(f"{mode:5s} {r['state']:9s} training {r['train_span_s']:7.1f} s at "
              f"{r['step_s']:.4f} s/step  lost/preemption "
              f"{r['node_s_lost_per_preemption']:6.1f} node-s  trained twice "
              f"{r['steps_trained_twice']:4d}  never trained {r['replica_steps_not_trained']:5d} "
              f"replica-steps  kill→replacement's first step "
              f"{r['kill_to_replacement_first_step_s']} s  replicas end equal: "
              f"{r['replicas_end_equal']}")  # fmt: skip
    ok = result["node_vs_gang_lost"] <= 0.25 and result["node"]["steps_trained_twice"] <= 3
    print(
        f"node / gang node-seconds lost per preemption: {result['node_vs_gang_lost']} "
        f"(goal ≤ 0.25; steps redone ≤ 1 per preemption): {'met' if ok else 'NOT met'}"
    )


if __name__ == "__main__":
    main()
