"""`up --deadline` across places (issue #27, Live): spot wherever it is, on-demand at home.

- Local rehearsal end to end: two places, each following its own time-compressed trace;
  the run starts in the one with spot, is preempted there and moves to the other, finishes
  by the deadline with the weights of an uninterrupted run, each place's cost in the state
  and in its launches' records (real controller process, supervisor, torchrun, checkpoints).
- SkyPilot, offline: only SkyPilot's API is answered (the model of tests/test_control.py,
  with capacity per region); capacity vanishes in one region and the run is relaunched pinned
  to the other.
- Bad input: one line, exit 2.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from mncloud import control, layout
from mncloud.backends.local.figures import read_final
from mncloud.cli import app
from mncloud.control.places import ManagedJobPlaces, places_controller
from mncloud.deadline.policy import Mode
from mncloud.layout import local_ckpt_dir
from mncloud.records.ledger import cost_summary
from mncloud.records.store import find_record, list_records
from mncloud.request import build_spec
from mncloud.spec.launch import LaunchOptions
from tests.fakesky import FakeSky
from tests.reference import start_reference
from tests.test_control import Cloud, FakeClock, train  # noqa: F401 - a fixture
from tests.test_local import EXAMPLE, run_log, wait_until
from tests.test_skypilot import script  # noqa: F401 - a fixture
from tests.ticking import ticker

runner = CliRunner()
NODES = ["--nodes", "2", "--gpus", "cpu:2", "--recovery", "gang"]
SCALE = 24  # a 60 s tick of the trace passes in 2.5 s
# Steps of known length (≥ 15 s in all): the run cannot finish in `east` before its trace
# takes spot away at 12.5 s, however fast the machine.
TRAIN = ["--steps", "300", "--ckpt-interval", "10", "--log-every", "100", "--compute-ms", "50"]


def _trace(folder: Path, name: str, data: list[int], gap: int = 60) -> Path:
    path = folder / f"{name}.json"
    path.write_text(json.dumps({"metadata": {"gap_seconds": gap}, "data": data}))
    return path


# ----------------------------------------------------------------------- local, end to end


@pytest.mark.slow
@pytest.mark.catalog
def test_a_run_moves_to_the_place_with_spot_and_meets_the_deadline(tmp_path: Path) -> None:
    """Place `east` has spot for 5 ticks, `west` from tick 3 on: spot in east, preempted
    there, launched again in west from the newest checkpoint; done by the deadline, run time
    paced by the training (`--pace-steps`), so on a slow machine too."""
    east = _trace(tmp_path, "east", [2] * 5 + [0] * 60)
    west = _trace(tmp_path, "west", [0] * 3 + [2] * 62)
    # The uninterrupted run beside this one: its load only slows the training, which the
    # paced run time waits for. The nodes' preflight is not what this run proves (skipped).
    uninterrupted = start_reference(EXAMPLE, NODES, TRAIN)
    args = ["up", str(EXAMPLE), "--cloud", "local", "--name", "dl", "--yes", *NODES,
            "--spot-trace", str(east), "--spot-trace", str(west), "--time-scale", str(SCALE),
            "--spot-price", "1", "--spot-price", "1.5", "--on-demand-price", "3",
            "--recovery-minutes", "2", "--deadline", "18m", "--hours", "0.15",
            "--pace-steps", "300", "--no-preflight", "--", *TRAIN]  # fmt: skip
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "spot in any of east (spot $1), west (spot $1.5); on-demand in east" in result.stdout
    state = wait_until(lambda: (s := control.load_state("dl")).final and s, 900, "the controller")
    assert isinstance(state, control.ControlState)
    assert state.phase == "finished", (state.detail, run_log("dl"))
    assert "deadline 0.3 h met" in state.detail, state.detail

    # It ran in both places, moved at least once, and each place's cost is its ledgers'.
    assert state.preemptions >= 1 and state.moves >= 1, state.decisions
    assert [state.run_places[r] for r in state.run_ids][:2] == ["east", "west"]
    assert {d.place for d in state.decisions if d.chose is Mode.SPOT} == {"east", "west"}
    by_place: dict[str, float] = {}
    for run_id in state.run_ids:
        record = find_record(run_id)
        launch = next(e for e in record.events if "deadline controller" in e.detail)
        assert launch.region == state.run_places[run_id]  # the ledger names the place
        where = state.run_places[run_id]
        by_place[where] = by_place.get(where, 0.0) + cost_summary(record).total
    assert state.place_costs["east"] > 0 and state.place_costs["west"] > 0
    for where, cost in by_place.items():
        assert state.place_costs[where] == pytest.approx(cost, rel=0.05, abs=1e-4)
    west_launch = find_record(state.run_ids[1]).events
    assert any(e.kind == "launch" and e.hourly_price == pytest.approx(2 * 1.5 * SCALE)
               for e in west_launch)  # fmt: skip
    status = json.loads(runner.invoke(app, ["status", "dl", "--json"]).stdout)[0]
    assert set(status["deadline"]["place_costs"]) == {"east", "west"}
    shown = runner.invoke(app, ["status", "dl"]).stdout
    assert "by place: east $" in shown

    reference, final = uninterrupted(), read_final(f"file://{local_ckpt_dir('dl')}")
    assert reference and final and final["weights_sha256"] == reference["weights_sha256"]


# ------------------------------------------------------------------ SkyPilot, offline


class Regions(Cloud):
    """The cloud model of tests/test_control.py with spot capacity per region: a managed
    job runs in the region its task is pinned to."""

    def __init__(self, regions: list[str]) -> None:
        super().__init__()
        self.open = dict.fromkeys(regions, True)
        """Whether each region has spot capacity now."""
        self.region: dict[int, str] = {}

    def answer(self, name: str, calls: list[tuple[str, tuple[Any, ...], dict[str, Any]]]) -> Any:
        if name == "jobs.launch":
            task = calls[-1][1][0]
            regions = {r.region for r in task.resources}
            assert len(regions) == 1, regions  # pinned to one place
            job_id = 7 + len(self.jobs)
            self.jobs[job_id], self.region[job_id] = "PENDING", regions.pop()
            self.spot[job_id] = any(r.use_spot for r in task.resources)
            return [job_id], None
        return super().answer(name, calls)

    def capacity(self, job_id: int) -> bool:
        return self.open[self.region[job_id]] or not self.spot[job_id]


@pytest.mark.catalog
def test_capacity_gone_in_one_region_relaunches_the_run_pinned_to_the_other(
    script: Path,  # noqa: F811 - the imported fixture
    fake_sky: FakeSky,
    tmp_path: Path,
) -> None:
    regions = ["us-central1", "europe-west4"]
    model = Regions(regions)

    class Answers(dict[str, Any]):
        def get(self, name: str, default: Any = None) -> Any:
            return model.answer(name, fake_sky.calls)

    fake_sky.answers = Answers()
    bucket = f"file://{tmp_path / 'bucket'}"
    spec = build_spec(script, gpus="H100:8", nodes=4, name="llm", bucket=bucket, region=regions)
    state = control.deadline_state(
        spec, LaunchOptions(hours=2, recovery_minutes=10), deadline_s=5 * 3600,
        hours_given=True, spot_price=[10.0, 11.0], on_demand_price=30.0,
    )  # fmt: skip
    places = state.config.places
    assert [(p.name, p.cloud, p.region, p.spot_price) for p in places] == [
        ("us-central1", "gcp", "us-central1", 10.0),
        ("europe-west4", "gcp", "europe-west4", 11.0),
    ]
    clock = FakeClock()
    model.clock = clock  # the queue's times on the test's clock
    ctl = places_controller(state, ManagedJobPlaces(), clock=clock)
    state.started_at = clock.now

    tick = ticker(ctl, state, clock)

    tick(3)  # spot in the home region (the cheaper): a managed job pinned there, running
    first = fake_sky.called("jobs.launch")[0][0][0]
    assert {r.region for r in first.resources} == {"us-central1"}
    assert state.mode is Mode.SPOT and state.place == 0
    model.open["us-central1"] = False  # preempted; SkyPilot looks for VMs there in vain
    tick(2)
    launches = fake_sky.called("jobs.launch")
    assert len(launches) == 2, state.decisions
    moved = launches[1][0][0]
    assert {r.region for r in moved.resources} == {"europe-west4"}
    assert all(r.use_spot for r in moved.resources)
    assert moved.envs["MNCLOUD_CKPT_URI"] == first.envs["MNCLOUD_CKPT_URI"] == f"{bucket}/llm"
    ((_args, kwargs),) = fake_sky.called("jobs.cancel")
    assert kwargs["job_ids"] == [7]  # the job in us-central1, taken down first
    assert state.place == 1 and state.moves == 1 and state.preemptions == 1
    assert state.place_missing_since[0] is not None and state.place_missing_since[1] is None
    tick(3)
    model.done = True
    tick()
    assert state.phase == "finished", state.detail

    records = list_records("llm")
    assert [r.run_id for r in records] == state.run_ids and len(records) == 2
    launched = [next(e for e in r.events if e.kind == "launch") for r in records]
    assert [(e.cloud, e.region, e.spot) for e in launched] == [
        ("gcp", "us-central1", True),
        ("gcp", "europe-west4", True),
    ]
    assert "(in europe-west4)" in launched[1].detail
    assert state.place_costs["us-central1"] > 0 and state.place_costs["europe-west4"] > 0
    total = sum(cost_summary(r, now=clock.now).total for r in records)
    assert sum(state.place_costs.values()) == pytest.approx(total, rel=1e-6)
    mirrored = control.load_uri(layout.control_state_uri(f"{bucket}/llm"))
    assert mirrored is not None and mirrored.deadline_status().place_costs


# ---------------------------------------------------------------------------- bad input


def _up(path: Path, *flags: str) -> Any:
    args = ["up", str(path), "--name", "dl", "--yes", "--deadline", "30h", "--hours", "20"]
    return runner.invoke(app, [*args, *flags])


@pytest.mark.catalog
def test_bad_places_input_is_one_line_and_exit_2(
    train: Path,  # noqa: F811 - the imported fixture
    tmp_path: Path,
) -> None:
    a, b = _trace(tmp_path, "a", [2] * 10), _trace(tmp_path, "b", [2] * 10)
    local = ["--cloud", "local", "--gpus", "cpu:1", "--nodes", "2"]
    cases = [
        ([*local, "--spot-trace", str(a), "--spot-trace", str(b), "--spot-price", "1",
          "--spot-price", "2", "--spot-price", "3"],
         "--spot-price given 3 times for 2 places (2 --spot-trace): give it once, or once per"),
        ([*local, "--spot-trace", str(a), "--spot-price", "1", "--spot-price", "2"],
         "--spot-price given 2 times for 1 place"),
        ([*local, "--spot-trace", str(a), "--spot-trace", str(_trace(tmp_path, "c", [2], 300))],
         "--spot-trace: the traces tick every 60 s, 300 s"),
        ([*local, "--spot-trace", str(a), "--spot-trace", str(_trace(tmp_path / "..", "a", [2]))],
         "two traces are named 'a'"),
        (["--gpus", "H100:8", "--nodes", "4", "--bucket", "s3://team-ckpt", "--cloud", "gcp",
          "--region", "us-central1", "--region", "us-nowhere-9"],
         "no offer for H100:8 on gcp in us-nowhere-9"),
        (["--gpus", "H100:8", "--nodes", "4", "--bucket", "s3://team-ckpt", "--region",
          "us-central1", "--region", "europe-west4", "--spot-price", "1", "--spot-price", "2",
          "--spot-price", "3"], "--spot-price given 3 times for 2 places (2 --region)"),
    ]  # fmt: skip
    for flags, expected in cases:
        result = _up(train, *flags)
        assert result.exit_code == 2, (flags, result.output)
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and expected in lines[0], lines
        assert not layout.control_state_file("dl").exists()


def test_the_egress_warning_names_the_cost_of_a_launch() -> None:
    """Across clouds at SkyPilot's egress price of the bucket's cloud; per launch for the
    newest checkpoint's size (what a launch in another place reads)."""
    from mncloud.storage import BucketState, egress_usd_per_gb, egress_warning

    s3 = BucketState("s3://b", exists=True, cloud="aws", region="us-east-1")
    rate = egress_usd_per_gb(s3, "gcp", "us-central1")
    assert 0.01 < rate < 1.0
    warning = egress_warning(s3, "gcp", "us-central1", 12.5)
    assert warning is not None and f"${rate:.2f}/GB" in warning
    assert f"${rate * 12.5:,.2f} per launch for the newest checkpoint, 12.5 GB" in warning
    assert egress_usd_per_gb(s3, "aws", "us-east-1") == 0.0
    assert "$0.02/GB" in (egress_warning(s3, "aws", "us-west-2") or "")


def test_one_controller_class_two_courses() -> None:
    """The variants are `Course`s the one `Controller` is given, not subclasses of it: each
    implements every member of the Protocol."""
    from mncloud.control.loop import Controller
    from mncloud.control.places import PlacesCourse
    from mncloud.control.steering import Course, OnePlace

    members = {n for n in vars(Course) if not n.startswith("_")}
    for course in (OnePlace, PlacesCourse):
        assert not {m for m in members if not callable(getattr(course, m, None))}, course
    assert Controller.__subclasses__() == []
