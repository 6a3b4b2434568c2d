"""Test session set-up.

SkyPilot computes its catalog paths when `sky` is first imported, so the offline catalog
snapshot (`../shared/catalogs`, beside the repository) is wired in here, at import time, before
any test module imports sky. Each test gets its own `MNCLOUD_HOME`.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from tests.fakesky import FakeSky

REPO = Path(__file__).resolve().parents[1]
SHARED_CATALOGS = REPO.parent / "shared" / "catalogs"

_session_tmp = Path(tempfile.mkdtemp(prefix="mncloud-tests-"))
os.environ["SKY_RUNTIME_DIR"] = str(_session_tmp / "sky-runtime")
os.environ["SKYPILOT_DISABLE_USAGE_COLLECTION"] = "1"
os.environ["MNCLOUD_HOME"] = str(_session_tmp / "home")
if SHARED_CATALOGS.is_dir():
    os.environ.setdefault("MNCLOUD_CATALOG_DIR", str(SHARED_CATALOGS))
HAVE_CATALOG = bool(os.environ.get("MNCLOUD_CATALOG_DIR"))
if HAVE_CATALOG:
    from mncloud import catalog as _catalog

    _catalog.use_catalog_dir()

pytest_plugins = ["tests.servers", "tests.skyseed"]

needs_catalog = pytest.mark.skipif(
    not HAVE_CATALOG, reason="no SkyPilot catalog snapshot (../shared/catalogs) and no network"
)


@pytest.fixture(autouse=True)
def mncloud_home(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fresh MNCLOUD_HOME for every test, so runs never leak between tests."""
    home = tmp_path_factory.mktemp("mncloud-home")
    monkeypatch.setenv("MNCLOUD_HOME", str(home))
    return home


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The heavy modules first (`_heavy_modules_first`); skip every test that needs the catalog
    when there is none, with the reason."""
    _heavy_modules_first(items)
    if HAVE_CATALOG:
        return
    for item in items:
        if item.get_closest_marker("catalog"):
            item.add_marker(needs_catalog)


#: The modules of minutes of real local runs each (the suite's durations), heaviest first.
HEAVY_MODULES = ("test_fsdp", "test_node_recovery", "test_trainers", "test_torchtitan",
                 "test_control_local",
                 "test_soak", "test_elastic", "test_local", "test_control_places",
                 "test_series", "test_runs", "test_preempt", "test_controller_crash",
                 "test_resume_reads", "test_published_scripts", "test_first_cloud_run",
                 "test_plan_is_up", "test_cloud_setup", "test_mlflow", "test_soak_mutations",
                 "test_tracker_runs")  # fmt: skip


def _heavy_modules_first(items: list[pytest.Item]) -> None:
    """Run HEAVY_MODULES first, each module's tests kept together and in order. pytest-xdist
    (`--dist loadfile`) hands whole modules to its workers in collection order: so the heavy
    ones start early and the run ends on short modules, not with one worker idle while the
    other finishes minutes of real runs."""

    def rank(item: pytest.Item) -> int:
        name = Path(item.nodeid.split("::")[0]).stem
        return HEAVY_MODULES.index(name) if name in HEAVY_MODULES else len(HEAVY_MODULES)

    items.sort(key=rank)  # stable: the rest keep their order


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Say how many commands the CLI help walk covered (tests/test_help.py), when it ran (under
    pytest-xdist the workers ran it: the walk is imported here to count it)."""
    import importlib
    import sys

    walk = sys.modules.get("tests.test_help")
    ran = any(
        getattr(report, "nodeid", "").startswith("tests/test_help.py")
        for reports in terminalreporter.stats.values()
        for report in reports
    )
    if walk is None and ran:
        walk = importlib.import_module("tests.test_help")
    if walk is not None:
        names = ", ".join(walk.IDS)
        terminalreporter.write_line(f"help walk: {len(walk.IDS)} commands ({names})")


@pytest.fixture(autouse=True)
def console_width_from_env() -> None:
    """Each test's own $COLUMNS for the CLI's consoles: rich fixes a Console's width when it is
    made if $COLUMNS is set then, so the test that first imported `mncloud.cli._common` (under
    whatever COLUMNS it set; which one depends on the order, xdist's included) would fix it for
    every later test in the process."""
    import sys

    common = sys.modules.get("mncloud.cli._common")
    if common is not None:
        for console in (common.console, common.err_console):
            console.width = None  # type: ignore[assignment]  # rich reads $COLUMNS again


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A small project folder (pyproject.toml + train.py), as a user's checkout would be."""
    folder = tmp_path / "proj"
    folder.mkdir()
    (folder / "pyproject.toml").write_text("[project]\nname='p'\n")
    (folder / "train.py").write_text("print('hi')\n")
    return folder


@pytest.fixture
def fake_sky(monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest) -> FakeSky:
    """SkyPilot's SDK answered by `tests/fakesky.py` (real signatures, real client-side work);
    any SDK call it does not fake fails the test. Its VMs run no node that could answer a stop
    notice, so `down`'s notice waits on a test clock (`tests/ticking.NoticeTime`), not 50 s of
    wall time; a test whose real processes answer it is marked `nodes_answer`."""
    from tests import fakesky

    if request.node.get_closest_marker("nodes_answer") is None:
        from mncloud.backends.skypilot import notice
        from tests.ticking import NoticeTime

        monkeypatch.setattr(notice, "time", NoticeTime())
    return fakesky.install(monkeypatch)
