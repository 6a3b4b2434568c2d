"""The goodput ledger (`mncloud/records/goodput.py`): hand-built records for each part, and a
real local 2-node run preempted once, read back through `runs cost --breakdown --json`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from mncloud.records.goodput import PARTS, GoodputLedger, StepMark, Telemetry, goodput_ledger
from mncloud.records.model import Event, RunRecord
from tests.test_local import (
    EXAMPLE,
    cli,
    run_log,
    state_of,
    steps_since,
    up,
    wait_final,
    wait_until,
)

#: $36/h for the whole job: one cent per second of the job.
PRICE = 36.0


Spec = tuple[str, float] | tuple[str, float, dict[str, Any]]


def _record(nodes: int, *events: Spec) -> RunRecord:
    """A record with these events, each at PRICE on spot unless its dict says otherwise."""
    evs = []
    for spec in events:
        fields: dict[str, Any] = {"hourly_price": PRICE, "spot": True}
        fields.update(spec[2] if len(spec) > 2 else {})  # type: ignore[misc]
        evs.append(Event(kind=spec[0], time=spec[1], **fields))  # type: ignore[arg-type]
    return RunRecord(
        run_id="r-20260101T000000-abcdef", name="r", user="u", host="h", created_at=0.0,
        backend="local", nodes=nodes, spec={}, task_yaml="", events=evs,
    )  # fmt: skip


def _marks(first_step: int, last_step: int, t0: float, **ckpt: float) -> list[StepMark]:
    """Steps first..last, one a second, the first finishing at t0."""
    return [
        StepMark(t=t0 + i, step=s, ckpt_s=ckpt.get(f"s{s}", 0.0))
        for i, s in enumerate(range(first_step, last_step + 1))
    ]


def _ns(ledger: GoodputLedger, part: str) -> float:
    return round(ledger.parts[part].node_seconds, 6)


def _adds_up(ledger: GoodputLedger) -> None:
    parts = ledger.parts.values()
    assert sum(p.node_seconds for p in parts) == pytest.approx(ledger.total_node_seconds)
    assert round(sum(p.cost for p in parts), 2) == round(ledger.total_cost, 2)
    assert abs(sum(p.cost for p in parts) - ledger.total_cost) < 0.005
    assert sum(p.cents for p in parts) == round(ledger.total_cost * 100)  # as shown
    assert all(p.node_seconds >= -1e-9 for p in parts)


def test_the_docstring_example_preempted_once_then_idle_at_the_end() -> None:
    """One node: start-up, useful, redone (retrained and in flight), waiting unbilled,
    recovery, idle."""
    record = _record(1, ("launch", 0.0), ("preemption", 45.0), ("recovery", 60.0),
                     ("finish", 105.0))  # fmt: skip
    steps = _marks(1, 14, 31.0, s10=0.5) + _marks(11, 30, 81.0)
    ledger = goodput_ledger(record, Telemetry(steps=steps, checkpoints=[30], final_step=30))
    _adds_up(ledger)
    assert ledger.launches == 2 and ledger.kept_step == 30
    assert ledger.total_node_seconds == pytest.approx(90.0)  # 45 s + 45 s billed
    assert ledger.total_cost == pytest.approx(0.90)
    # Each launch to its first step's start: the first's (0..30) is start-up, the relaunch's
    # (60..80) recovery.
    assert _ns(ledger, "startup") == 30.0 and _ns(ledger, "recovery") == 20.0
    # Steps 1..10 in launch 1 and 11..30 in launch 2 are in the final model; step 10's save
    # blocked 0.5 s of its second.
    assert ledger.parts["useful"].steps == 30 and _ns(ledger, "useful") == 29.5
    assert _ns(ledger, "checkpoint_stall") == 0.5
    # Steps 11..14 were trained again; 44..45 was the step in flight at the preemption.
    assert ledger.parts["redone"].steps == 4 and _ns(ledger, "redone") == 5.0
    assert _ns(ledger, "idle") == 5.0  # after step 30 (t=100) until the finish (t=105)
    assert _ns(ledger, "waiting") == 0.0 and ledger.unbilled_node_seconds == 15.0
    assert ledger.parts["idle"].cost == pytest.approx(0.05)
    assert ledger.goodput == pytest.approx(29.5 / 90)
    assert ledger.cost_per_1k_useful_steps == pytest.approx(0.90 / 30 * 1000)
    assert ledger.unmeasured == []


def test_a_run_never_preempted_has_a_start_up_and_no_recovery() -> None:
    """Its cold start (provisioning, imports, the preflight) is the first launch's start-up:
    no relaunch happened, so nothing is recovery (issue #60: it read "recovery 74%")."""
    from mncloud.records.goodput import part_label

    record = _record(2, ("launch", 0.0), ("finish", 40.0))
    ledger = goodput_ledger(record, Telemetry(steps=_marks(1, 10, 31.0), final_step=10))
    _adds_up(ledger)
    assert _ns(ledger, "startup") == 2 * 30.0 and _ns(ledger, "recovery") == 0.0
    assert _ns(ledger, "useful") == 2 * 10.0 and ledger.launches == 1
    assert part_label("startup") == "start-up" and part_label("checkpoint_stall") == (
        "checkpoint stall"
    )


def test_steps_saved_but_not_reported_before_a_kill_are_useful() -> None:
    """Launch 1 reported steps 1..12 but saved step 15 before the kill (its last telemetry
    segment lost with the nodes); launch 2 resumed after 15: steps 13..15 are useful, trained
    once, and take their seconds out of the preempted launch's tail, not the step in flight."""
    record = _record(1, ("launch", 0.0), ("preemption", 20.0), ("recovery", 30.0),
                     ("finish", 50.0))  # fmt: skip
    steps = _marks(1, 12, 2.0) + _marks(16, 30, 32.0)  # 13..15 ran from 13 to 16, unreported
    ledger = goodput_ledger(record, Telemetry(steps=steps, checkpoints=[30], final_step=30))
    _adds_up(ledger)
    assert ledger.parts["useful"].steps == 30 and ledger.parts["redone"].steps == 0
    # 13..16 the three unreported steps, 16..20 the step in flight when the nodes went.
    assert _ns(ledger, "useful") == 12 + 3 + 15 and _ns(ledger, "redone") == 4.0


def test_a_deadline_run_waiting_for_its_market_waits_unbilled_until_now() -> None:
    """Between launches, and after a preemption of a run not over, nothing is billed."""
    record = _record(2, ("launch", 0.0), ("preemption", 20.0), ("launch", 100.0),
                     ("preemption", 120.0))  # fmt: skip
    steps = _marks(1, 19, 1.0) + _marks(11, 29, 101.0)
    ledger = goodput_ledger(record, Telemetry(steps=steps, checkpoints=[20]), now=200.0)
    _adds_up(ledger)
    # Nodes × (100 - 20) between the launches, and × (200 - 120) since the last preemption.
    assert ledger.unbilled_node_seconds == pytest.approx(2 * 80 + 2 * 80)
    assert ledger.total_node_seconds == pytest.approx(2 * 40)
    assert ledger.parts["waiting"].cost == 0.0
    # Launch 1's steps 11..19 came again; launch 2's 21..29 are past the newest checkpoint.
    assert ledger.parts["redone"].steps == 9
    assert ledger.parts["useful"].steps == 10 + 10
    assert ledger.parts["unsaved"].steps == 9


def test_node_recovery_replacement_waits_until_it_healed() -> None:
    """2 nodes: node 1 lost at 50 (billed alone: not), joined at 70, healed from a peer at 75."""
    half = {"hourly_price": PRICE / 2, "node": 1}
    record = _record(2, ("launch", 0.0), ("node-lost", 50.0, half),
                     ("node-joined", 70.0, {"node": 1}), ("node-healed", 75.0, {"node": 1}),
                     ("finish", 100.0))  # fmt: skip
    ledger = goodput_ledger(record, Telemetry(steps=_marks(1, 95, 1.0), final_step=95))
    _adds_up(ledger)
    assert ledger.total_node_seconds == pytest.approx(2 * 50 + 1 * 20 + 2 * 30)
    assert _ns(ledger, "waiting") == 5.0  # one node, 70..75
    assert ledger.parts["waiting"].cost == pytest.approx(5 * 0.005)  # half the job's $/s
    assert ledger.unbilled_node_seconds == pytest.approx(20.0)  # node 1 being provisioned
    assert _ns(ledger, "idle") == 10.0  # both nodes, 95..100
    assert _ns(ledger, "useful") == pytest.approx(180 - 15)
    assert ledger.parts["useful"].steps == 95 and ledger.parts["redone"].steps == 0


def test_idle_tail_and_a_launch_that_never_stepped() -> None:
    """A first launch that failed before its first step is all start-up, the restart's way to
    its first step recovery; a long tail after the last step until teardown is idle."""
    record = _record(1, ("launch", 0.0), ("failure", 30.0), ("restart", 40.0),
                     ("finish", 200.0))  # fmt: skip
    ledger = goodput_ledger(record, Telemetry(steps=_marks(1, 10, 51.0), final_step=10))
    _adds_up(ledger)
    assert _ns(ledger, "startup") == 30.0 and _ns(ledger, "recovery") == 10.0
    assert _ns(ledger, "idle") == 200.0 - 60.0
    assert _ns(ledger, "useful") == 10.0
    assert ledger.goodput == pytest.approx(10 / 190)
    # Preempted after its final step (during the final save): that tail is idle, not redone.
    late = _record(1, ("launch", 0.0), ("preemption", 30.0), ("recovery", 40.0),
                   ("finish", 50.0))  # fmt: skip
    ledger = goodput_ledger(late, Telemetry(steps=_marks(1, 10, 11.0), final_step=10))
    _adds_up(ledger)
    assert _ns(ledger, "idle") == 30.0 - 20.0 and _ns(ledger, "redone") == 0
    assert _ns(ledger, "startup") == 10.0
    assert _ns(ledger, "recovery") == 10.0  # launch 2 had nothing left to train


def test_a_running_run_and_a_cloud_run_without_step_telemetry() -> None:
    """Running: steps past the newest checkpoint and the step in flight are unsaved. Without
    per-step telemetry every billed second is unknown and goodput is not invented."""
    record = _record(1, ("launch", 0.0))
    steps = _marks(1, 20, 1.0)
    ledger = goodput_ledger(record, Telemetry(steps=steps, checkpoints=[10]), now=30.0)
    _adds_up(ledger)
    assert ledger.parts["unsaved"].steps == 10 and _ns(ledger, "unsaved") == 10.0 + 10.0
    cloud = goodput_ledger(record, Telemetry(checkpoints=[10]), now=30.0)
    _adds_up(cloud)
    assert _ns(cloud, "unknown") == 30.0 and cloud.goodput is None
    assert cloud.cost_per_1k_useful_steps is None
    assert set(cloud.unmeasured) == {"useful", "redone", "unsaved", "startup", "recovery",
                                     "checkpoint_stall", "idle"}  # fmt: skip
    assert set(cloud.parts) == set(PARTS)


def test_an_old_local_run_folder_with_only_progress_lines(tmp_path: Path) -> None:
    """A local run from before the telemetry segments kept its steps in the run folder's
    `progress.jsonl` (rank 0's lines): the ledger still reads them; a torn line is skipped."""
    from mncloud import layout
    from mncloud.backends.local.state import LocalLaunch, save_launch
    from mncloud.operate import run_telemetry

    record = _record(1, ("launch", 0.0))
    folder = layout.run_dir(record.name)
    folder.mkdir(parents=True)
    save_launch(folder, LocalLaunch(
        name=record.name, token="t", task_id="x", num_nodes=1, procs_per_node=1,
        master_port=1, ckpt_uri=f"file://{tmp_path / 'ckpt'}", run_id=record.run_id,
        workdir=str(tmp_path), run="true",
    ))  # fmt: skip
    lines = [{"t": 1.0, "event": "start", "resumed_from": 0}, {"t": 2.0, "step": 1, "loss": 1.0}]
    body = "".join(json.dumps(r) + "\n" for r in [*lines, {"t": 3.0, "step": 2}])
    (folder / "progress.jsonl").write_text(body + '{"t": 4.0, "st')
    telemetry = run_telemetry(record, bucket=False)
    assert telemetry.steps is not None and [m.step for m in telemetry.steps] == [1, 2]


def test_breakdown_needs_a_known_run() -> None:
    """Bad input: one line `error: …` and exit 2, no traceback."""
    from typer.testing import CliRunner

    from mncloud.cli import app

    for args in (["runs", "cost", "--breakdown"], ["runs", "cost", "nope", "--breakdown"]):
        result = CliRunner().invoke(app, args)
        assert result.exit_code == 2, result.output
        lines = result.output.splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: "), result.output


# --------------------------------------------------------------------------- slow, end to end


@pytest.mark.slow
@pytest.mark.catalog
def test_a_local_run_preempted_once() -> None:
    """2 nodes × 1 process, killed once after a checkpoint and steps past it."""
    from mncloud.backends.base import RunState
    from mncloud.operate import run_telemetry
    from mncloud.records.store import load_current
    from mncloud.storage import CheckpointStore

    # Long enough that the kill lands mid-training, after a checkpoint, however fast steps are:
    # it comes within a telemetry interval (0.5 s) or so of step 28, 770 steps before the end.
    steps = 800
    args = ["--steps", str(steps), "--ckpt-interval", "25", "--log-every", "500"]
    up("gp", EXAMPLE, "--nodes", "2", "--gpus", "cpu:1", "--recovery-delay", "0.5s",
       script_args=args)  # fmt: skip
    store = CheckpointStore(state_of("gp").ckpt_uri)

    def checkpoint_behind_training() -> bool:
        good, _ = store.candidates()
        return bool(good) and max(steps_since("gp", 0), default=0) > good[0] + 3

    wait_until(checkpoint_behind_training, 180, "a checkpoint, and steps past it")
    cli("chaos", "preempt", "gp", "--node", "1")
    state = wait_final("gp")
    assert state.state is RunState.SUCCEEDED, run_log("gp")
    killed = next(e for e in state.events if e.kind == "preempted")
    newest = int(killed.data["latest_checkpoint"])
    launches = [e.t for e in state.events if e.kind == "launch"]
    # The supervisor's record writer adds the finish event just after state.json says so.
    record = wait_until(lambda: (r := load_current("gp")).finished and r, 30, "finish")
    ledger = goodput_ledger(record, run_telemetry(record))
    assert ledger.launches == 2
    last_before_kill = max(s for s, t in _steps_with_times("gp") if launches[0] <= t < launches[1])
    # The ledger reads the same segments: what the kill's lost last segments held (at most
    # one local segment interval of steps) is neither here nor there.
    assert ledger.parts["redone"].steps == max(0, last_before_kill - newest)
    assert ledger.parts["useful"].steps == steps and ledger.kept_step == steps
    _adds_up(ledger)
    assert ledger.goodput is not None and 0 < ledger.goodput < 1
    # The cold start is the first launch's start-up; the relaunch's way back is recovery.
    assert _ns(ledger, "startup") > 0 and _ns(ledger, "recovery") > 0
    # Priced (a local run costs $0 unless a deadline rehearsal prices it): still to the cent.
    priced = record.model_copy(
        update={"events": [e.model_copy(update={"hourly_price": 98.32}) for e in record.events]}
    )
    priced_ledger = goodput_ledger(priced, run_telemetry(priced))
    _adds_up(priced_ledger)
    assert priced_ledger.total_cost > 0 and priced_ledger.parts["redone"].cost > 0
    shown = json.loads(cli("runs", "cost", record.run_id, "--breakdown", "--json").output)
    assert GoodputLedger.model_validate(shown) == ledger
    status = json.loads(cli("status", "gp", "--json").output)[0]
    assert status["goodput"] == pytest.approx(ledger.goodput)
    from mncloud.cli.follow import goodput_line  # the demo's summary line

    line = goodput_line("gp") or ""
    assert line.startswith(f"goodput {ledger.goodput:.0%} of ")
    assert line.endswith(f"mncloud runs cost {record.run_id} --breakdown")


def _steps_with_times(name: str) -> list[tuple[int, float]]:
    """Every rank's steps with their times, from the run's telemetry segments."""
    from mncloud.backends.local.figures import read_run_series
    from mncloud.layout import run_dir

    return [(r.step, r.t) for r in read_run_series(run_dir(name)).steps]
