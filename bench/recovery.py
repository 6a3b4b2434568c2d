"""bench/recovery: what a preemption costs a local 2 × 2 run, against its cold start.

    .venv/bin/python bench/recovery.py [--preemptions 3] [--recovery-delay 2s] [--json]

Launches `examples/train_ddp.py` with `mncloud up --cloud local --nodes 2 --gpus cpu:2
--detach` (1000 steps, checkpoint every 50) and preempts it (SIGKILL of a whole node, like a
spot VM vanishing) once per attempt, ~60 steps into it: node 1, then node 0 (the rendezvous
host), then node 1 while it writes a checkpoint. From the run's events and rank 0's telemetry
it reports:

- cold start: first launch of the nodes → first finished training step;
- resume: preemption → first finished step after the relaunch (includes `--recovery-delay`,
  re-import of torch, rendezvous, checkpoint load). Goal: ≤ cold start + 5 s;
- steps lost: steps trained before the preemption and trained again after it. Goal: ≤ one
  checkpoint interval (a kill during a save loses up to the interval plus the save's steps).

It also checks that the run's final weights equal those of the same run without preemptions
(sha256 from final.json), so the figures are for a recovery that is actually correct.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from _local import EXAMPLE, fresh_home, mncloud, progress_lines, wait

STEPS, INTERVAL = 1000, 50


def launch(name: str, delay: str) -> None:
    mncloud("up", str(EXAMPLE), "--cloud", "local", "--nodes", "2", "--gpus", "cpu:2",
            "--name", name, "--detach", "--recovery-delay", delay, "--max-restarts", "10",
            "--recovery", "gang",
            "--", "--steps", str(STEPS), "--ckpt-interval", str(INTERVAL))  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description="Recovery time and lost steps of a local run.")
    p.add_argument("--preemptions", type=int, default=3)
    p.add_argument("--recovery-delay", default="2s")
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    fresh_home()

    from mncloud.backends.local.figures import read_final, recovery_figures
    from mncloud.backends.local.state import load_state
    from mncloud.layout import run_dir

    def final_state(name: str):  # type: ignore[no-untyped-def]
        return wait(lambda: (s := load_state(run_dir(name))).state.is_final and s, 900, name)

    # The uninterrupted reference first (also the cold-start figure without chaos around it).
    launch("reference", args.recovery_delay)
    ref = final_state("reference")
    ref_fig = recovery_figures(run_dir("reference"))
    launch("chaos", args.recovery_delay)
    folder = run_dir("chaos")
    kills = _preempt(folder, args.preemptions)
    state = final_state("chaos")
    fig = recovery_figures(folder)
    same = (read_final(state.ckpt_uri) or {}).get("weights_sha256") == (
        read_final(ref.ckpt_uri) or {}
    ).get("weights_sha256")
    cold = ref_fig.cold_start_s or 0.0
    rows = []
    for k, (record, resume, lost) in enumerate(
        zip(kills, fig.resume_s, fig.lost_per_recovery, strict=False)
    ):
        rows.append({
            "preemption": k + 1,
            "node": record["node"],
            "during_save": record["during_save_step"] is not None,
            "resume_s": resume,
            "resume_minus_cold_s": round(resume - cold, 2),
            "steps_lost": lost,
        })  # fmt: skip
    result = {
        "cold_start_s": cold,
        "cold_start_chaos_run_s": fig.cold_start_s,
        "recovery_delay": args.recovery_delay,
        "checkpoint_interval": INTERVAL,
        "preemptions": rows,
        "wall_reference_s": round(ref_fig.wall_s or 0.0, 1),
        "wall_chaos_s": round(fig.wall_s or 0.0, 1),
        "final_weights_equal_reference": same,
        "goal_resume_le_cold_plus_5s": all(r["resume_minus_cold_s"] <= 5 for r in rows),
        "goal_lost_le_interval": all(r["steps_lost"] <= INTERVAL for r in rows),
        "state": state.state.value,
    }
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        _print(result)


def _preempt(folder: Path, preemptions: int) -> list[dict]:
    """Kill a node ~60 steps into each attempt: node 1, node 0, node 1 during a save, …"""
    from mncloud.backends.local.chaos import preempt_node
    from mncloud.backends.local.state import load_state

    plan = [(1, False), (0, False), (1, True)]
    kills = []
    for i in range(preemptions):
        node, during_save = plan[i % len(plan)]
        attempt = i + 1
        wait(lambda a=attempt: load_state(folder).attempt == a, 300, f"attempt {attempt}")
        launched = [e.t for e in load_state(folder).events if e.kind == "launch"][-1]

        def steps(t0: float = launched) -> list[int]:
            recs = progress_lines(folder)
            return [r["step"] for r in recs if "event" not in r and r["t"] >= t0]

        wait(lambda: len(steps()) >= 60, 300, f"60 steps in attempt {attempt}")
        kills.append(preempt_node(folder, node, by="bench", during_save=during_save))
    return kills


def _print(result: dict) -> None:
    cold, rows = result["cold_start_s"], result["preemptions"]
    same = result["final_weights_equal_reference"]
    delay = result["recovery_delay"]
    print(f"cold start (launch → first step): {cold:.1f} s   "
          f"[recovery delay {delay}, checkpoint every {INTERVAL} steps]")  # fmt: skip
    print(f"{'#':>2} {'node':>4} {'during save':>11} {'resume s':>9} {'− cold s':>9} {'lost':>5}")
    for r in rows:
        save = "yes" if r["during_save"] else "no"
        print(f"{r['preemption']:>2} {r['node']:>4} {save:>11} {r['resume_s']:>9.1f} "
              f"{r['resume_minus_cold_s']:>+9.1f} {r['steps_lost']:>5}")  # fmt: skip
    print(f"wall: {result['wall_chaos_s']} s with {len(rows)} preemptions vs "
          f"{result['wall_reference_s']} s uninterrupted; final weights equal: {same}")  # fmt: skip
    print(f"goals: resume ≤ cold + 5 s: {result['goal_resume_le_cold_plus_5s']}; "
          f"lost ≤ one interval: {result['goal_lost_le_interval']}")  # fmt: skip


if __name__ == "__main__":
    main()
