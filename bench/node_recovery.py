"""bench/node_recovery: the same three preemptions under gang and under node recovery.

    .venv/bin/python bench/node_recovery.py [--provision-delay 10s] [--steps 20000] [--json]

Launches `examples/train_ddp.py` on the local backend, 3 nodes × 1 process (`cpu:1`, so the
2-core machine is not oversubscribed), checkpoint every 100 steps, three times: uninterrupted
(the baseline), `--recovery gang` and `--recovery node`, both with the same modeled
`--provision-delay` and the same three SIGKILLs (node 1, node 2, node 1 again) at 20 %, 45 % and
70 % of the steps, each once the run is whole again after the previous one (else a second
loss during a replacement would be two at once: a gang relaunch). Reports per run:

- wall time, launch to the end;
- node-seconds lost per preemption: N × (wall − baseline wall) plus the replica-steps the run
  never trained (node recovery: a lost node's data shard while it is replaced) at the baseline's
  seconds per step, divided by 3. Goal: node ≤ 0.25 × gang;
- steps trained twice: gang, steps rank 0 reported more than once; node, the steps a survivor
  tried and did not commit (one all-reduce that met the dead peer). Goal: node ≤ 1 per
  preemption;
- kill → training again whole: gang, rank 0's first step after the relaunch; node, the
  replacement's first step or heal (the survivors never stopped).

The provisioning delay is a model of a cloud's (a laptop cannot show a VM's minutes); the
figures compare the two recoveries under the same model, on the same machine, in one run.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from _local import EXAMPLE, fresh_home, mncloud, wait

NODES, INTERVAL, KILLS = 3, 100, ((0.15, 1), (0.40, 2), (0.65, 1))


def launch(name: str, recovery: str, delay: str, steps: int) -> None:
    mncloud("up", str(EXAMPLE), "--cloud", "local", "--nodes", str(NODES), "--gpus", "cpu:1",
            "--name", name, "--detach", "--yes", "--recovery", recovery,
            "--provision-delay", delay, "--max-restarts", "10", "--",
            "--steps", str(steps), "--ckpt-interval", str(INTERVAL),
            "--log-every", str(steps))  # fmt: skip


def _progress(folder: Path) -> list[dict[str, Any]]:
    from mncloud.backends.local.state import PROGRESS_FILE, read_jsonl

    return read_jsonl(folder / PROGRESS_FILE)


def _steps(folder: Path, after: float = 0.0) -> list[dict[str, Any]]:
    return [r for r in _progress(folder) if "loss" in r and r["t"] > after]


def _events(folder: Path, kind: str, after: float) -> list[Any]:
    from mncloud.backends.local.state import load_state

    return [e for e in load_state(folder).events if e.kind == kind and e.t > after]


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
    from mncloud.backends.local.state import load_state

    return load_state(folder).state.is_final


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


def _figures(
    folder: Path, kills: list[float], back: list[float], base: dict[str, float], steps: int
) -> dict:
    from mncloud.backends.local.state import load_state

    state = load_state(folder)
    wall = (state.ended_at or 0.0) - (state.started_at or 0.0)
    lines = _steps(folder)
    node_mode = any("node" in r for r in lines)
    if node_mode:
        trained = sum(len({r["step"] for r in lines if r["node"] == n}) for n in range(NODES))
        retries = [r for r in _progress(folder) if r.get("event") == "retry" and r["t"] > kills[0]]
        twice = len({r["step"] for r in retries})  # every survivor redoes the same step
    else:
        trained = NODES * steps
        twice = len(lines) - len({r["step"] for r in lines})
    missing = NODES * steps - trained
    lost = NODES * (wall - base["wall"]) + missing * base["step_s"]
    to_first = [b - k for k, b in zip(kills, back, strict=True)]
    return {
        "state": state.state.value,
        "wall_s": round(wall, 1),
        "node_s_lost_per_preemption": round(lost / len(kills), 1),
        "replica_steps_not_trained": missing,
        "steps_trained_twice": twice,
        "kill_to_replacement_first_step_s": [round(x, 1) for x in to_first],
    }


def main() -> None:
    p = argparse.ArgumentParser(description="Gang vs node recovery under the same preemptions.")
    p.add_argument("--provision-delay", default="10s")
    p.add_argument("--steps", type=int, default=20000)
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    fresh_home()
    from mncloud.backends.local.state import load_state
    from mncloud.layout import run_dir

    def final(name: str):  # type: ignore[no-untyped-def]
        return wait(lambda: (s := load_state(run_dir(name))).state.is_final and s, 1800, name)

    launch("baseline", "gang", args.provision_delay, args.steps)
    ref = final("baseline")
    ref_steps = _steps(run_dir("baseline"))
    step_s = (ref_steps[-1]["t"] - ref_steps[0]["t"]) / max(1, len(ref_steps) - 1)
    base = {"wall": (ref.ended_at or 0.0) - (ref.started_at or 0.0), "step_s": step_s}
    result: dict[str, Any] = {"baseline_wall_s": round(base["wall"], 1),
                              "baseline_step_s": round(step_s, 4),
                              "provision_delay": args.provision_delay}  # fmt: skip
    for recovery in ("gang", "node"):
        launch(recovery, recovery, args.provision_delay, args.steps)
        kills, back = _preempt(run_dir(recovery), args.steps)
        final(recovery)
        result[recovery] = _figures(run_dir(recovery), kills, back, base, args.steps)
    gang, node = result["gang"]["node_s_lost_per_preemption"], result["node"]
    result["node_vs_gang_lost"] = round(node["node_s_lost_per_preemption"] / gang, 3)
    _print(result, args.json)


def _print(result: dict, as_json: bool) -> None:
    if as_json:
        print(json.dumps(result, indent=2))
        return
    print(f"baseline (no preemption): {result['baseline_wall_s']} s, "
          f"{result['baseline_step_s']} s/step; provisioning modeled as "
          f"{result['provision_delay']}")  # fmt: skip
    for mode in ("gang", "node"):
        r = result[mode]
        print(f"{mode:5s} {r['state']:9s} wall {r['wall_s']:7.1f} s  lost/preemption "
              f"{r['node_s_lost_per_preemption']:6.1f} node-s  trained twice "
              f"{r['steps_trained_twice']:4d}  never trained {r['replica_steps_not_trained']:5d} "
              f"replica-steps  kill→replacement's first step "
              f"{r['kill_to_replacement_first_step_s']} s")  # fmt: skip
    ok = result["node_vs_gang_lost"] <= 0.25 and result["node"]["steps_trained_twice"] <= 3
    print(
        f"node / gang node-seconds lost per preemption: {result['node_vs_gang_lost']} "
        f"(goal ≤ 0.25; steps redone ≤ 1 per preemption): {'met' if ok else 'NOT met'}"
    )


if __name__ == "__main__":
    main()
