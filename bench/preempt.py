"""bench/preempt: steps lost per preemption with a notice (goal 0) and without (≤ one interval).

    .venv/bin/python bench/preempt.py [--preemptions 3] [--notice 30s] [--protocol gcp]

Launches `examples/train_ddp.py` twice with `mncloud up --cloud local --nodes 2 --gpus cpu:2
--detach` (600 steps, checkpoint every 50), one run after the other, and preempts each one
`--preemptions` times, at a random step 10–90 steps into each attempt, on a random node:

- without notice: SIGKILL of the node, like a spot VM vanishing (`chaos preempt`); the run
  resumes from the newest periodic checkpoint;
- with notice: the node's metadata (a local server speaking `--protocol`'s protocol) announces
  the preemption `--notice` ahead (`chaos preempt --notice`); all ranks agree on a step at the
  next step boundary, save it, exit 115; the node would be killed at the deadline.

Steps lost = steps trained before a preemption and trained again after it (from rank 0's
steps in the run's telemetry). It also checks that both runs end with the same final weights
(sha256 in final.json), so both recoveries are correct, and reports the preemptions that
needed the kill.
"""

from __future__ import annotations

import argparse
import json
import random
from typing import Any

from _local import EXAMPLE, fresh_home, mncloud, progress_lines, wait

STEPS, INTERVAL = 600, 50


def run(
    name: str, preemptions: int, notice: str | None, protocol: str, rng: random.Random
) -> dict[str, Any]:
    from mncloud.backends.local.figures import read_final, recovery_figures
    from mncloud.backends.local.state import load_state
    from mncloud.layout import run_dir

    mncloud("up", str(EXAMPLE), "--cloud", "local", "--nodes", "2", "--gpus", "cpu:2",
            "--name", name, "--detach", "--yes", "--recovery-delay", "0s", "--max-restarts",
            str(preemptions + 2), "--", "--steps", str(STEPS), "--ckpt-interval",
            str(INTERVAL), "--log-every", "1000")  # fmt: skip
    folder = run_dir(name)
    for attempt in range(1, preemptions + 1):
        wait(lambda a=attempt: load_state(folder).attempt >= a, 300, f"attempt {attempt}")
        launched = [e.t for e in load_state(folder).events if e.kind == "launch"][-1]

        def steps(t0: float = launched) -> list[int]:
            recs = progress_lines(folder)
            return [r["step"] for r in recs if "event" not in r and r["t"] >= t0]

        offset = rng.randrange(10, 90)
        wait(lambda o=offset: len(steps()) >= o, 300, f"{offset} steps in attempt {attempt}")
        node = str(rng.randrange(2))
        extra = ["--notice", notice, "--cloud-protocol", protocol] if notice else []
        mncloud("chaos", "preempt", name, "--node", node, *extra)
        wait(lambda a=attempt: load_state(folder).attempt > a or load_state(folder).state.is_final,
             300, "the relaunch")  # fmt: skip
    state = wait(lambda: (s := load_state(folder)).state.is_final and s, 900, f"{name} to end")
    fig = recovery_figures(folder)
    progress = [r for r in progress_lines(folder) if "event" not in r]
    chaos = [e.t for e in state.events if e.kind == ("chaos-notice" if notice else "chaos-preempt")]
    # The step rank 0 had finished when the notice (or the kill) landed.
    at_steps = [max((r["step"] for r in progress if r["t"] <= t), default=0) for t in chaos]
    stopped = [e.t for e in state.events if e.kind == "preempted"]
    return {
        "state": state.state.value,
        "at_steps": at_steps,
        "lost": fig.lost_per_recovery,
        "resumed_from": fig.resumed_from[1:],
        "killed": sum(e.kind == "chaos-preempt" for e in state.events),
        "resume_s": fig.resume_s,
        "notice_to_stop_s": [round(b - a, 2) for a, b in zip(chaos, stopped, strict=False)],
        "wall_s": round(fig.wall_s or 0.0, 1),
        "weights": (read_final(state.ckpt_uri) or {}).get("weights_sha256"),
    }


def main() -> None:
    p = argparse.ArgumentParser(description="Steps lost per preemption, with and without notice.")
    p.add_argument("--preemptions", type=int, default=3)
    p.add_argument("--notice", default="30s")
    p.add_argument("--protocol", default="gcp", choices=["aws", "gcp", "azure"])
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    fresh_home()
    rng = random.Random(args.seed)
    without = run("kill", args.preemptions, None, args.protocol, rng)
    with_notice = run("notice", args.preemptions, args.notice, args.protocol, rng)
    result = {
        "checkpoint_interval": INTERVAL,
        "notice": args.notice,
        "protocol": args.protocol,
        "without_notice": without,
        "with_notice": with_notice,
        "final_weights_equal": without["weights"] == with_notice["weights"] is not None,
        "goal_with_notice_0_lost": with_notice["lost"] == [0] * args.preemptions,
        "goal_without_le_interval": all(n <= INTERVAL for n in without["lost"]),
    }
    if args.json:
        print(json.dumps(result, indent=2))
        return
    print(
        f"2 nodes × 2 ranks, checkpoint every {INTERVAL} steps, {args.preemptions} "
        f"preemptions per run at random steps; notice {args.notice} ({args.protocol})"
    )
    print(f"{'':16} {'at step':>18} {'steps lost':>14} {'mean':>6} {'killed':>7} {'wall s':>7}")
    for label, r in (("without notice", without), ("with notice", with_notice)):
        mean = sum(r["lost"]) / max(len(r["lost"]), 1)
        print(f"{label:16} {r['at_steps']!s:>18} {r['lost']!s:>14} {mean:>6.1f} "
              f"{r['killed']:>7} {r['wall_s']:>7}")  # fmt: skip
    print(f"with notice, from the notice to all nodes stopped (saved, exit 115): "
          f"{with_notice['notice_to_stop_s']} s")  # fmt: skip
    print(f"final weights equal: {result['final_weights_equal']}; goals: with notice 0 lost: "
          f"{result['goal_with_notice_0_lost']}, without ≤ one interval: "
          f"{result['goal_without_le_interval']}")  # fmt: skip


if __name__ == "__main__":
    main()
