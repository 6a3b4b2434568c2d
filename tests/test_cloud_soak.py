"""The cloud fault soak (`tests/cloudsoak.py`), short: a few seeds of a dozen faults each.
`bench/cloud_soak.sh` runs the long version (MNCLOUD_CLOUD_SOAK_SEEDS, _FAULTS)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.cloudsoak import SECRET, soak, soak_state
from tests.fakesky import FakeSky
from tests.test_skypilot import script  # noqa: F401 - a fixture

pytestmark = pytest.mark.catalog
SEEDS = int(os.environ.get("MNCLOUD_CLOUD_SOAK_SEEDS", "1"))
FAULTS = int(os.environ.get("MNCLOUD_CLOUD_SOAK_FAULTS", "12"))


@pytest.mark.parametrize("seed", range(SEEDS))
def test_cloud_faults_keep_one_job_bill_and_leave_nothing(
    seed: int,
    script: Path,  # noqa: F811
    fake_sky: FakeSky,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("SOAK_TOKEN", SECRET)
    report = soak(fake_sky, monkeypatch, tmp_path, soak_state(script, tmp_path), seed, FAULTS)
    print(f"cloud soak seed {seed}: {sum(report.faults.values())} faults {report.faults}, "
          f"{report.looks} looks, {report.launches} launches, "
          f"{report.downs_refused} downs refused, billed {report.billed_s:.0f} s "
          f"of {report.ran_s:.0f} s run")  # fmt: skip
    assert report.violations == []
    assert sum(report.faults.values()) >= 1 and report.looks >= 1


@pytest.mark.parametrize("seed", range(SEEDS))
def test_cloud_faults_on_a_job_group(
    seed: int,
    script: Path,  # noqa: F811
    fake_sky: FakeSky,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The same soak over a `--recovery node` run (a job group): a failed node's siblings
    are cancelled before the relaunch, never two gangs."""
    from mncloud.render import jobgroup

    script.write_text("from mncloud.train import Replicas\nreplicas = Replicas({})\n")
    monkeypatch.setattr(jobgroup, "require_bucket", lambda _spec: None)
    monkeypatch.setenv("SOAK_TOKEN", SECRET)
    state = soak_state(script, tmp_path, recovery="node")
    report = soak(fake_sky, monkeypatch, tmp_path, state, 1000 + seed, FAULTS)
    print(f"cloud soak (job group) seed {1000 + seed}: {sum(report.faults.values())} faults "
          f"{report.faults}, {report.looks} looks, {report.launches} launches, "
          f"{report.downs_refused} downs refused, billed {report.billed_s:.0f} s "
          f"of {report.ran_s:.0f} s run")  # fmt: skip
    assert report.violations == []
    assert sum(report.faults.values()) >= 1 and report.looks >= 1
