"""bench/soak: a long local run through many faults of every kind, ending with exact weights.

    .venv/bin/python bench/soak.py [--faults 100] [--seed 1] [--no-controller] [--json]

Runs `examples/train_ddp.py` on 2 local nodes × 2 processes (gang recovery, exact mode,
checkpoint every 20 steps) twice: once uninterrupted (the reference), then once more under a
deadline controller (a spot trace that never loses spot, time-compressed 12×, a deadline far
away: the controller stays on one market and only watches) while `--faults` faults are
injected one after the other, each drawn at random (seeded; every kind at least once):

    kill              SIGKILL of every process of a random node (a spot VM vanishing)
    notice            a spot preemption notice (AWS, GCP or Azure protocol, 30 s) to a node:
                      every rank saves the step it reached and exits 115
    storage           the bucket (a file:// one) unreachable for 5–30 s
    kill-during-save  SIGKILL of a node while its ranks write a checkpoint (a torn step)
    controller        `kill -9` of the deadline controller (its keeper restarts it)
    down-resume       `mncloud down` (a notice: every rank saves), then `mncloud up --resume`

Each fault is injected once the run trains again after the previous one and has trained
21–40 more steps (read from the run's own state and telemetry; every wait is bounded).
Goals: the run SUCCEEDS; its final weights equal the reference's (sha256 in final.json);
0 failed checkpoint loads; 0 checkpoints lost; 0 processes left. Definitions:

- a *failed load*: a CheckpointError or traceback in a rank's log, or a resume from scratch
  although a complete checkpoint existed (a torn step skipped on the way is not one: those are
  counted apart, as `torn steps skipped`);
- a *lost checkpoint*: a resume that started from an older step than the newest complete one
  in the bucket just before the fault was injected, or older than the resume before it;
- *processes left*: live processes carrying any of the run's launch tags (every supervisor,
  launcher, torchrun and worker, `processes.tagged_pids`), and the controller and its keeper,
  20 s after the run and its controller ended.

`tests/test_soak.py` runs the same `soak()` with one fault of each kind.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _local import EXAMPLE, fresh_home

T = TypeVar("T")
KINDS = ("kill", "notice", "storage", "kill-during-save", "controller", "down-resume")
INTERVAL = 20
NODES = ["--cloud", "local", "--nodes", "2", "--gpus", "cpu:2", "--recovery", "gang",
         "--recovery-delay", "0s", "--max-restarts", "1000", "--yes", "--detach"]  # fmt: skip
# Deadline mode, held on on-demand: a trace without spot and a deadline that leaves no time to
# wait for it (24 h of work by 24 h 2 min of run time; 60 s ticks compressed 12× to 5 s, so a
# controller restarted by `up --resume` decides within seconds, and the soak ends long before
# the deadline).
DEADLINE = ["--deadline", "1442m", "--hours", "24", "--time-scale", "12", "--spot-price", "1",
            "--on-demand-price", "3", "--recovery-minutes", "1"]  # fmt: skip
WAIT_S = 300.0


class SoakError(Exception):
    """The soak could not go on (a bounded wait ran out, a command failed)."""


def wait(check: Callable[[], T], timeout: float, what: str) -> T:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if value := check():
                return value
        except SoakError:
            raise
        except Exception:  # a state file being replaced: read it again
            pass
        time.sleep(0.2)
    raise SoakError(f"timed out after {timeout:g}s waiting for {what}")


def cli(*args: str) -> str:
    exe = Path(sys.executable).parent / "mncloud"
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "mncloud"]
    done = subprocess.run([*cmd, *args], capture_output=True, text=True)
    if done.returncode != 0:
        raise SoakError(f"mncloud {' '.join(args)}: exit {done.returncode}: {done.stderr.strip()}")
    return done.stdout


def draw(faults: int, seed: int, kinds: tuple[str, ...]) -> list[dict[str, Any]]:
    """The faults in order (kind, node, outage seconds, notice protocol, steps trained
    before it); every kind at least once when they fit."""
    rng = random.Random(seed)
    order = rng.sample(kinds, len(kinds))[:faults]
    order += rng.choices(kinds, k=faults - len(order))
    rng.shuffle(order)
    return [{"kind": k, "node": rng.randrange(2), "seconds": round(rng.uniform(5, 30), 1),
             "protocol": rng.choice(["aws", "gcp", "azure"]),
             "gap": rng.randint(INTERVAL + 1, 2 * INTERVAL)} for k in order]  # fmt: skip


class Run:
    """The soak run: its folder, its launch tags, its archived segments (each `down` +
    `up --resume` starts a fresh run folder; the old one's files are kept here first)."""

    def __init__(self, name: str, args: list[str], trace: Path | None) -> None:
        from mncloud.layout import run_dir

        self.name, self.args, self.trace = name, args, trace
        self.controller = trace is not None
        self.folder = run_dir(name)
        self.archive = self.folder.parent.parent / "soak-segments" / name
        self.segments: list[Path] = []
        self.tokens: set[str] = set()
        self.controller_pids: set[int] = set()
        self._uri: str | None = None
        self._tail: Any = None
        self._lines: list[dict[str, Any]] = []

    def up(self, *extra: str) -> None:
        cli("up", str(EXAMPLE), "--name", self.name, *NODES, *extra, *self.args)

    def deadline(self) -> list[str]:
        return [*DEADLINE, "--spot-trace", str(self.trace)] if self.trace else []

    def start(self) -> None:
        self.up(*self.deadline())
        self._wait_launch(None)

    def _wait_launch(self, old_token: str | None) -> None:
        from mncloud.backends.local.state import load_launch

        token = wait(lambda: (t := load_launch(self.folder).token) != old_token and t, WAIT_S,
                     "the run's launch")  # fmt: skip
        self.tokens.add(token)
        self._note_controller()

    def _note_controller(self) -> None:
        if self.controller:
            from mncloud import control

            st = control.load_state(self.name, fresh=False)
            self.controller_pids |= {p for p in (st.pid, st.keeper_pid) if p}

    def progress(self) -> list[dict[str, Any]]:
        """Rank 0's steps and every event of the run's telemetry as lines, read on from where
        the last call stopped (thousands of steps; a relaunch after `down` is a new run id,
        a new series)."""
        from mncloud.backends.local.state import series_uri
        from mncloud.telemetry.seriestail import SeriesTail

        uri = series_uri(self.folder)
        if uri is None:
            return []
        if uri != self._uri:
            self._uri, self._tail, self._lines = uri, SeriesTail(uri), []
        new = self._tail.read()
        self._lines += [{"t": r.t, "step": r.step} for r in new.steps if r.rank == 0 and not r.node]
        self._lines += [{**e.data, "t": e.t, "event": e.event} for e in new.events]
        return self._lines

    def steps_after(self, t0: float) -> list[int]:
        return [r["step"] for r in self.progress() if "event" not in r and "step" in r
                and r["t"] >= t0]  # fmt: skip

    def start_after(self, t0: float) -> dict[str, Any] | None:
        return next((r for r in self.progress() if r.get("event") == "start" and r["t"] > t0),
                    None)  # fmt: skip

    def latest_complete(self) -> int | None:
        from mncloud.backends.local.state import load_state
        from mncloud.storage import CheckpointStore

        good, _ = CheckpointStore(load_state(self.folder).ckpt_uri).candidates()
        return good[0] if good else None

    def keep_segment(self) -> None:
        """Copy the run folder's state and logs aside (a relaunch wipes them), with its
        telemetry's lines as `progress.jsonl`."""
        dest = self.archive / f"segment-{len(self.segments)}"
        dest.mkdir(parents=True, exist_ok=True)
        for f in self.folder.glob("*"):
            if f.is_file() and f.suffix in (".json", ".jsonl", ".log"):
                shutil.copy2(f, dest / f.name)
        lines = "".join(json.dumps(r) + "\n" for r in self.progress())
        (dest / "progress.jsonl").write_text(lines)
        self.segments.append(dest)

    def down_resume(self) -> None:
        from mncloud.backends.local.state import load_launch

        old = load_launch(self.folder).token
        cli("down", self.name)
        self.keep_segment()
        self.up("--resume", *self.deadline())
        self._wait_launch(old)


def inject(run: Run, fault: dict[str, Any]) -> dict[str, Any]:
    """One fault; returns its record once the run trains again after it."""
    from mncloud.backends.local.chaos import notify_node, preempt_node, storage_outage
    from mncloud.backends.local.processes import pid_alive

    kind, node = fault["kind"], fault["node"]
    rec: dict[str, Any] = {"kind": kind, "node": node, "t": time.time()}
    rec["complete_before"] = run.latest_complete()
    rec["step_before"] = max(run.steps_after(0), default=None)
    relaunch = kind in ("kill", "notice", "kill-during-save", "down-resume")
    if kind == "kill":
        preempt_node(run.folder, node, by="soak")
    elif kind == "kill-during-save":
        rec["torn_step"] = preempt_node(run.folder, node, by="soak", during_save=True,
                                        save_timeout=WAIT_S)["during_save_step"]  # fmt: skip
    elif kind == "notice":
        rec["protocol"] = fault["protocol"]
        notify_node(run.folder, node, 30.0, protocol=rec["protocol"])
    elif kind == "storage":
        rec["seconds"] = fault["seconds"]
        for _line in storage_outage(run.folder, fault["seconds"]):
            pass
    elif kind == "controller":
        from mncloud import control

        old = control.load_state(run.name, fresh=False).pid
        if not old:
            raise SoakError("the deadline controller has no pid in its state")
        os.kill(old, signal.SIGKILL)
        # Not `controller_running`: it takes the controller's lock for a moment, and a
        # restarted controller that finds the lock taken exits (another one runs).
        wait(lambda: (p := control.load_state(run.name, fresh=False).pid) not in (None, old)
             and pid_alive(p), 60, "the controller's restart")  # fmt: skip
        run._note_controller()
    elif kind == "down-resume":
        run.down_resume()
    else:
        raise ValueError(kind)
    t_after = time.time()
    if relaunch:
        t0 = 0.0 if kind == "down-resume" else rec["t"]
        start = wait(lambda: run.start_after(t0) or _ended(run), WAIT_S,
                     f"the resume after {kind}")  # fmt: skip
        rec["resumed_from"] = int(start.get("resumed_from") or 0)
        rec["resume_s"] = round(start["t"] - rec["t"], 1)
        base, since = rec["resumed_from"], start["t"]
    else:
        base, since = max(run.steps_after(0), default=0), t_after
    rec["wait_s"] = round(time.time() - rec["t"], 1)
    wait(lambda: max(run.steps_after(since), default=0) > base or _ended(run), WAIT_S,
         f"training after {kind}")  # fmt: skip
    return rec


def _ended(run: Run) -> bool:
    """False while the run goes on; SoakError once it ended (mid-fault: it did not recover)."""
    from mncloud.backends.local.state import load_state

    state = load_state(run.folder)
    if state.state.is_final:
        raise SoakError(f"the run ended {state.state.value}: {state.detail}")
    return False


def finished(run: Run) -> bool:
    from mncloud.backends.local.state import load_state

    return load_state(run.folder).state.is_final


def analyse(run: Run, faults: list[dict[str, Any]]) -> dict[str, Any]:
    """Failed loads, lost checkpoints, torn steps and node errors over every segment."""
    from mncloud.backends.local.state import read_jsonl

    starts: list[int] = []
    errors: list[str] = []
    torn: set[tuple[str, int]] = set()
    node_errors = 0
    for seg in run.segments:
        for r in read_jsonl(seg / "progress.jsonl"):
            if r.get("event") == "start":
                starts.append(int(r.get("resumed_from") or 0))
        with contextlib.suppress(OSError, ValueError):
            events = json.loads((seg / "state.json").read_text()).get("events", [])
            node_errors += sum(e.get("kind") == "error" for e in events)
        # run.log holds every rank's lines (node-N.log the same again, per node).
        text = (seg / "run.log").read_text(errors="replace") if (seg / "run.log").is_file() else ""
        torn |= {(seg.name, int(n)) for n in re.findall(r"checkpoint step (\d+) skipped", text)}
        errors += [f"{seg.name}: {line.strip()[:200]}" for line in text.splitlines()
                   if "CheckpointError" in line]  # fmt: skip
    failed_loads = len(errors)
    lost: list[str] = []
    for f in faults:
        if "resumed_from" not in f:
            continue
        before, got = f["complete_before"], f["resumed_from"]
        if before is not None and got == 0:
            failed_loads += 1
            lost.append(f"{f['kind']}: resumed from scratch, step {before} was complete")
        elif before is not None and got < before:
            lost.append(f"{f['kind']}: resumed from {got}, step {before} was complete")
    for a, b in itertools.pairwise(starts):
        if b < a:
            lost.append(f"a resume from step {b} after one from step {a}")
    return {"failed_loads": failed_loads, "load_errors": errors[:10], "lost": lost,
            "torn_skipped": len(torn), "resumes": len(starts) - 1,
            "node_errors": node_errors}  # fmt: skip


def processes_left(run: Run, settle_s: float = 20.0) -> list[int]:
    from mncloud.backends.local.processes import pid_alive, tagged_pids

    def alive() -> list[int]:
        pids = {p for token in run.tokens for p in tagged_pids(token)}
        return sorted(pids | {p for p in run.controller_pids if pid_alive(p)})

    deadline = time.monotonic() + settle_s
    while (left := alive()) and time.monotonic() < deadline:
        time.sleep(0.2)
    return left


def soak(
    faults: int = 100,
    seed: int = 1,
    *,
    controller: bool = True,
    steps: int | None = None,
    storage_s: tuple[float, float] | None = None,
    time_limit_s: float | None = None,
    reference_alongside: bool = False,
    log: Callable[[str], None] = lambda _line: None,
) -> dict[str, Any]:
    """Reference run, then the faulted run; the figures and whether each goal is met.
    `reference_alongside` runs the two at once (the suite's short form: it waits less, and
    the reference's wall time then says nothing about the faults' cost).
    Uses $MNCLOUD_HOME as it is (the bench points it at a fresh folder; tests have theirs)."""
    from mncloud import layout

    kinds = KINDS if controller else tuple(k for k in KINDS if k != "controller")
    plan = draw(faults, seed, kinds)
    if storage_s is not None:
        lo, hi = storage_s
        for f in plan:
            f["seconds"] = round(lo + (f["seconds"] - 5) / 25 * (hi - lo), 1)
    # Every fault needs ≤ 40 steps of training past its resume; a storage outage trains on
    # through it (~33 steps/s here): room for all of them, so the run cannot end early.
    steps = steps or 150 + 60 * faults + sum(
        int(f["seconds"] * 45) for f in plan if f["kind"] == "storage"
    )
    trace = layout.home() / "soak-trace.json"
    trace.parent.mkdir(parents=True, exist_ok=True)
    trace.write_text(json.dumps({"metadata": {"gap_seconds": 60}, "data": [0] * 400}))

    try:
        return _soak(plan, steps, trace if controller else None, time_limit_s,
                     reference_alongside, log)  # fmt: skip
    except BaseException:  # a failed wait, Ctrl-C: leave nothing running behind
        for name in ("soak", "soak-ref"):
            with contextlib.suppress(Exception):
                cli("down", name, "--now")
        raise


def _soak(
    plan: list[dict[str, Any]],
    steps: int,
    trace: Path | None,
    time_limit_s: float | None,
    reference_alongside: bool,
    log: Callable[[str], None],
) -> dict[str, Any]:
    from mncloud import control
    from mncloud.backends.local.figures import read_final
    from mncloud.backends.local.state import load_state

    args = ["--", "--steps", str(steps), "--ckpt-interval", str(INTERVAL), "--log-every", "1000"]
    log(f"reference: 2×2, {steps} steps, checkpoint every {INTERVAL}")
    t0 = time.time()
    ref = Run("soak-ref", args, None)
    ref.start()
    if not reference_alongside:
        wait(lambda: finished(ref), 3600, "the reference run")

    run = Run("soak", args, trace)
    t_start = time.time()
    run.start()
    wait(lambda: run.steps_after(0), WAIT_S, "the first training step")
    done: list[dict[str, Any]] = []
    stopped_early = ""
    for i, fault in enumerate(plan):
        kind, node = fault["kind"], fault["node"]
        if time_limit_s is not None and time.time() - t_start > time_limit_s:
            stopped_early = f"time limit {time_limit_s:g}s reached after {i} faults"
            break
        last = max(run.steps_after(0), default=0)
        with contextlib.suppress(SoakError):
            wait(lambda g=fault["gap"], s=last: max(run.steps_after(0), default=0) >= s + g
                 or finished(run), WAIT_S, "steps before the fault")  # fmt: skip
        if finished(run):
            stopped_early = f"the run ended after {i} faults"
            break
        try:
            rec = inject(run, fault)
        except SoakError as err:
            rec = {"kind": kind, "node": node, "error": str(err)}
            done.append(rec)
            log(f"fault {i + 1}/{len(plan)} {kind}: {err}")
            stopped_early = f"fault {i + 1} ({kind}): {err}"
            cli("down", run.name, "--now")  # it cannot go on: stop it, the goal is not met
            break
        done.append(rec)
        log(
            f"fault {i + 1}/{len(plan)} {kind:16} node {node} at step {rec['step_before']}: "
            f"resumed from {rec.get('resumed_from', '-')}, trains again after {rec['wait_s']} s"
        )
    final_state = wait(lambda: (s := load_state(run.folder)).state.is_final and s, 3600,
                       "the run to end")  # fmt: skip
    if trace is not None:
        with contextlib.suppress(SoakError):
            wait(lambda: control.load_state(run.name, fresh=False).final, 120,
                 "the controller to end")  # fmt: skip
    wall = time.time() - t_start
    wait(lambda: finished(ref), 3600, "the reference run")
    ref_state = load_state(ref.folder)
    ref_wall = (ref_state.ended_at or time.time()) - (ref_state.started_at or t0)
    reference = read_final(ref_state.ckpt_uri) or {}
    log(f"reference: {ref_state.state.value} in {ref_wall:.1f} s")
    run.keep_segment()
    final = read_final(final_state.ckpt_uri) or {}
    run._note_controller()
    left = processes_left(run) + processes_left(ref, 0)
    found = analyse(run, [d for d in done if "error" not in d])
    survived = Counter(d["kind"] for d in done if "error" not in d)
    same = bool(final.get("weights_sha256")) and final.get("weights_sha256") == reference.get(
        "weights_sha256")  # fmt: skip
    result = {
        "faults_planned": len(plan),
        "faults_survived": sum(survived.values()),
        "by_kind": dict(sorted(survived.items())),
        "stopped_early": stopped_early,
        "steps": steps,
        "state": final_state.state.value,
        "detail": final_state.detail,
        "restarts": final_state.restarts,
        "weights_sha256": final.get("weights_sha256"),
        "reference_sha256": reference.get("weights_sha256"),
        "weights_equal": same,
        "failed_loads": found["failed_loads"],
        "load_errors": found["load_errors"],
        "checkpoints_lost": len(found["lost"]),
        "lost": found["lost"],
        "torn_skipped": found["torn_skipped"],
        "node_errors": found["node_errors"],
        "resumes": found["resumes"],
        "segments": len(run.segments),
        "processes_left": left,
        "wall_s": round(wall, 1),
        "reference_wall_s": round(ref_wall, 1),
        "faults": done,
    }
    result["goal_met"] = (
        result["state"] == "SUCCEEDED" and same and not found["failed_loads"]
        and not found["lost"] and not left and not stopped_early and not found["node_errors"]
    )  # fmt: skip
    return result


def report(r: dict[str, Any]) -> str:
    kinds = ", ".join(f"{k} {n}" for k, n in r["by_kind"].items())
    resume = [f["resume_s"] for f in r["faults"] if "resume_s" in f]
    lines = [
        f"faults survived:      {r['faults_survived']}/{r['faults_planned']} ({kinds})"
        + (f"; stopped early: {r['stopped_early']}" if r["stopped_early"] else ""),
        f"final state:          {r['state']} ({r['detail']})",
        f"final weights:        {'==' if r['weights_equal'] else '!='} uninterrupted reference "
        f"(sha256 {str(r['weights_sha256'])[:16]}… vs {str(r['reference_sha256'])[:16]}…)",
        f"failed loads:         {r['failed_loads']}"
        + (f" {r['load_errors']}" if r["load_errors"] else ""),
        f"checkpoints lost:     {r['checkpoints_lost']}" + (f" {r['lost']}" if r["lost"] else ""),
        f"torn steps skipped:   {r['torn_skipped']} (a kill during a save; not a failed load)",
        f"node errors:          {r['node_errors']} (a node exiting with an error, not a fault)",
        f"resumes:              {r['resumes']} over {r['segments']} launch(es) of the name; "
        f"fault → training again: median {_median(resume)} s, max {max(resume, default=0)} s",
        f"processes left:       {len(r['processes_left'])}"
        + (f" {r['processes_left']}" if r["processes_left"] else ""),
        f"wall time:            {r['wall_s']} s vs {r['reference_wall_s']} s uninterrupted "
        f"({r['wall_s'] / max(r['reference_wall_s'], 1e-9):.1f}×), {r['steps']} steps",
        "goal met" if r["goal_met"] else "goal NOT met",
    ]
    return "\n".join(lines)


def _median(xs: list[float]) -> float:
    xs = sorted(xs)
    return xs[len(xs) // 2] if xs else 0.0


def main() -> None:
    p = argparse.ArgumentParser(description="Many faults of every kind on one local run.")
    p.add_argument("--faults", type=int, default=100)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--steps", type=int, default=None, help="training steps (default: room for "
                   "every fault)")  # fmt: skip
    p.add_argument("--no-controller", action="store_true",
                   help="no deadline controller, no controller kills")  # fmt: skip
    p.add_argument(
        "--time-limit",
        type=float,
        default=None,
        help="stop injecting faults after this many seconds of the faulted run",
    )
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    fresh_home()
    result = soak(args.faults, args.seed, controller=not args.no_controller, steps=args.steps,
                  time_limit_s=args.time_limit,
                  log=lambda line: print(line, file=sys.stderr, flush=True))  # fmt: skip
    print(json.dumps(result, indent=2) if args.json else report(result), flush=True)
    sys.exit(0 if result["goal_met"] else 1)


if __name__ == "__main__":
    main()
