"""`plan` is what `up` launches (issue #60): the same script and options give the same place
and price; without a script `plan` names the recovery it assumed; offline without a catalog,
one line naming `MNCLOUD_CATALOG_DIR` and the install page.

`up --dryrun` runs SkyPilot's own dry run for real (its enabled clouds seeded, the catalog
snapshot) with its SDK answered by `tests/fakesky` and the GCS emulator as the bucket. The
snapshot has no AWS GPU image for SkyPilot 0.14's dry run, so the dry runs here are on GCP; the
issue's AWS case is held on the plan `up` shows before its dry run.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from mncloud.cli import app
from tests.docblocks import ROOT
from tests.fakesky import FakeSky
from tests.servers import free_port
from tests.skyseed import sky_enabled_clouds  # noqa: F401 - a fixture

pytestmark = pytest.mark.catalog
runner = CliRunner()
EXAMPLE = ROOT / "examples" / "train_ddp.py"  # uses mncloud.train.Replicas: node recovery


def _wins(output: str) -> str:
    """The plan's verdict line ("… wins at $X expected …"), whitespace made single."""
    text = " ".join(output.split())
    found = re.search(r"(spot|on-demand) \S+ \S+ in \S+ wins at \$[\d,.]+", text)
    assert found, output
    return found.group(0)


@pytest.mark.slow
@pytest.mark.parametrize("nodes", [1, 4])
def test_plan_of_the_script_is_where_up_dryrun_launches(
    nodes: int,
    fake_sky: FakeSky,
    sky_enabled_clouds: list[str],  # noqa: F811 - the fixture imported above
    gcs_env: object,
) -> None:
    """The same script, market and bucket: `plan --json`'s choice is the place and price `up
    --dryrun --json` reports, and both print the same verdict; on 4 nodes both are node
    recovery's (the script uses Replicas), which SkyPilot's dry run places as a job group."""
    market = ["--cloud", "gcp", "--gpus", "H100:8" if nodes > 1 else "L4:1", "--spot"]
    market += ["--nodes", str(nodes), "--bucket", "gs://plan-is-up"]
    planned = runner.invoke(app, ["plan", str(EXAMPLE), *market, "--json"])
    assert planned.exit_code == 0, planned.output
    plan = json.loads(planned.stdout)
    assert plan["request"]["recovery"] == ("node" if nodes > 1 else "gang")
    assert plan["recovery_assumed"] is None
    launched = runner.invoke(app, ["up", str(EXAMPLE), *market, "--dryrun", "--json"])
    assert launched.exit_code == 0, launched.output
    status = json.loads(launched.stdout)
    choice = plan["choice"]
    assert "dry run passed" in status["detail"], status["detail"]
    assert (status["cloud"], status["region"], status["instance_type"]) == (
        choice["cloud"],
        choice["region"],
        choice["instance_type"],
    )
    assert status["hourly_total"] == pytest.approx(choice["hourly_total"])
    shown = runner.invoke(app, ["plan", str(EXAMPLE), *market])
    dry = runner.invoke(app, ["up", str(EXAMPLE), *market, "--dryrun", "--yes"])
    assert dry.exit_code == 0, dry.output
    assert _wins(shown.stdout) == _wins(dry.stdout)
    assert not fake_sky.called("jobs.launch")


@pytest.mark.slow
def test_the_issues_aws_plan_is_the_one_up_shows(sky_enabled_clouds: list[str]) -> None:  # noqa: F811
    """Issue #60's case: `plan` without the script priced gang recovery (ap-northeast-1,
    $3,523.76) while `up` launched node recovery (us-east-1, $1,198.43). Without a script it
    now says which recovery it assumed; with the script and bucket it plans `up`'s."""
    market = ["--cloud", "aws", "--gpus", "H100:8", "--nodes", "4", "--spot", "--hours", "24"]
    bare = runner.invoke(app, ["plan", *market])
    assert bare.exit_code == 0, bare.output
    assert "recovery: gang, assumed (no script given)" in " ".join(bare.stdout.split())
    scripted = runner.invoke(app, ["plan", str(EXAMPLE), *market, "--bucket", "s3://plan-is-up"])
    assert scripted.exit_code == 0, scripted.output
    assert "node recovery" in scripted.stdout and "recovery: gang, assumed" not in scripted.stdout
    verdict = _wins(scripted.stdout)
    assert verdict == "spot aws p5.48xlarge in us-east-1 wins at $1,198.43", verdict


def test_plan_without_a_script_names_the_recovery_it_assumed() -> None:
    """2+ nodes and no script: the note (and `recovery_assumed` in --json); none on one node,
    with --recovery given, or with a script."""
    base = ["plan", "--cloud", "gcp", "--gpus", "L4:1", "--spot"]
    for args, assumed in (
        (["--nodes", "2"], True),
        (["--nodes", "1"], False),
        (["--nodes", "2", "--recovery", "gang"], False),
    ):
        result = runner.invoke(app, [*base, *args, "--json"])
        assert result.exit_code == 0, result.output
        note = json.loads(result.stdout)["recovery_assumed"]
        assert (note is not None) is assumed, (args, note)
        if assumed:
            assert "plan SCRIPT --bucket" in note and "Replicas" in note
    result = runner.invoke(app, [*base, "--nodes", "2"])
    assert "recovery: gang, assumed" in " ".join(result.stdout.split())


@pytest.mark.slow
def test_offline_plan_without_a_catalog_is_one_line_naming_the_fix(tmp_path: Path) -> None:
    """No catalog snapshot and no network (a proxy on a closed port stands for it): one line on
    stderr naming MNCLOUD_CATALOG_DIR and the install page, exit 2, no traceback."""
    env = {k: v for k, v in os.environ.items() if k != "MNCLOUD_CATALOG_DIR"}
    closed = f"http://127.0.0.1:{free_port()}"
    env |= {"SKY_RUNTIME_DIR": str(tmp_path / "sky"), "MNCLOUD_HOME": str(tmp_path / "home")}
    env |= {"HTTPS_PROXY": closed, "HTTP_PROXY": closed, "NO_PROXY": "", "no_proxy": ""}
    done = subprocess.run(
        [sys.executable, "-m", "mncloud", "plan", "--gpus", "H100:8"],
        env=env, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith("error: cannot read SkyPilot's accelerator list"), line
    assert "MNCLOUD_CATALOG_DIR" in line and "getting-started/install.md" in line
    page = (ROOT / "docs" / "getting-started" / "install.md").read_text()
    assert "## Offline: a catalog snapshot" in page  # the section the line names


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("rsync") is None, reason="SkyPilot's dry run needs rsync on PATH")
def test_a_node_recovery_dryrun_without_credentials_says_so_and_exits_0(tmp_path: Path) -> None:
    """No cloud set up (a fresh SkyPilot state) and a job group (node recovery): the plan and
    the task are checked, SkyPilot's own dry run is said to need credentials, exit 0; the
    lighthouse task is not named as a failure (issue #60)."""
    env = {**os.environ, "SKY_RUNTIME_DIR": str(tmp_path / "fresh-sky"), "COLUMNS": "100"}
    args = ["up", str(EXAMPLE), "--cloud", "gcp", "--gpus", "L4:1", "--nodes", "2", "--spot"]
    args += ["--bucket", "gs://plan-is-up", "--dryrun", "--yes", "--name", "two"]
    done = subprocess.run(
        [sys.executable, "-m", "mncloud", *args],
        env=env, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "name: two-lighthouse" in done.stdout  # the job group's task, printed
    tail = " ".join(done.stdout.split()[-40:])
    assert "plan and task are valid" in tail and "sky check" in tail, tail
    assert "cannot dry-run" not in done.stderr
