"""Issue #43 point 12's leftovers on the cloud path: a failed cancel leaves no stop notice, an
on-demand launch that found no capacity is made again with backoff, the journal's bucket copy.

On `tests/fakesky/` (its `fail`), with real file:// buckets and run records.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from sky import exceptions as sx
from sky.jobs import ManagedJobStatus as S

from mncloud.errors import MncloudError
from tests.fakesky import FakeSky
from tests.test_skypilot import _launched, script  # noqa: F401 - a fixture

pytestmark = pytest.mark.catalog


def test_a_failed_cancel_leaves_no_stop_notice_behind(
    script: Path,  # noqa: F811
    fake_sky: FakeSky,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`down` gives the running job its notice, then the cancel fails: the job lives on (a
    second `down` will stop it), and its restarts (exit 115) must not find the notice and
    stop again."""
    from mncloud.backends.skypilot import notice
    from mncloud.storage import CheckpointStore
    from mncloud.storage.stoprequest import read_stop_request

    monkeypatch.setattr(notice, "GRACE_S", 0.0)  # no node answers here: no wait for one
    backend = _launched(script, fake_sky, spot=True, bucket=f"file://{tmp_path / 'b'}")
    fake_sky.set_status(7, S.RUNNING)
    ckpt_uri = backend.status("llm").ckpt_uri
    assert ckpt_uri is not None
    fake_sky.fail("jobs.cancel", sx.PermissionDeniedError("not yours to cancel"))
    with pytest.raises(MncloudError, match="not yours"):
        backend.down("llm", notice_s=0.001)
    assert fake_sky.live_jobs("llm") == [7]
    assert read_stop_request(CheckpointStore(ckpt_uri)) is None


def test_on_demand_without_capacity_is_relaunched_with_backoff_not_at_once(
    script: Path,  # noqa: F811
    fake_sky: FakeSky,
    tmp_path: Path,
) -> None:
    """Past the deadline the run is on-demand; SkyPilot finds no on-demand VMs anywhere
    (FAILED_NO_RESOURCE): the relaunch waits 1 min, the next one 2 min (not 3 launches in
    one look), and the wait is in the state a restarted controller reads."""
    from mncloud.control.outcomes import capacity_backoff_s
    from mncloud.deadline.policy import Mode
    from tests.test_control_cloud import Driver, _launches, _named, _state
    from tests.test_control_faults import _looks

    run = Driver(_state(script, tmp_path))
    _looks(run, 1)
    fake_sky.set_status(_named(fake_sky, "llm")[-1], S.RUNNING)
    run.clock.now += 5 * 3600  # past the 4 h deadline: on-demand
    _looks(run, 2, gap=1)
    assert run.state.market is Mode.ON_DEMAND and len(_launches(fake_sky)) == 2
    for relaunch in (1, 2):
        fake_sky.set_status(_named(fake_sky, "llm")[-1], S.FAILED_NO_RESOURCE)
        launches = len(_launches(fake_sky))
        _looks(run, 3, gap=1)
        assert len(_launches(fake_sky)) == launches and run.state.phase != "failed"
        assert run.state.relaunch_at is not None and run.state.relaunches == relaunch
        run.clock.now = run.state.relaunch_at
        _looks(run, 1)
        assert len(_launches(fake_sky)) == launches + 1
        assert run.state.market is Mode.ON_DEMAND and run.state.relaunch_at is None
    assert capacity_backoff_s(2) == 2 * capacity_backoff_s(1) == 120.0


def test_a_launch_is_sent_only_once_its_journal_is_in_the_bucket(
    script: Path,  # noqa: F811
    fake_sky: FakeSky,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A controller restarted on a fresh VM knows only the bucket's copy of the journal: a
    launch journaled here alone could be made twice. The bucket cannot be written: the look is
    unsure and nothing is launched; once it can, the launch is made, once."""
    from mncloud.control import state as state_module
    from tests.test_control_cloud import Driver, _launches, _state
    from tests.test_control_faults import _looks

    run = Driver(_state(script, tmp_path))
    real_object = state_module._object

    def unwritable(uri: str) -> object:
        raise OSError("the bucket refused the write")

    monkeypatch.setattr(state_module, "_object", unwritable)
    _looks(run, 1)
    assert _launches(fake_sky) == [] and run.state.launching is None
    assert "journal could not be written" in run.state.detail and run.state.phase != "failed"
    monkeypatch.setattr(state_module, "_object", real_object)
    _looks(run, 2)
    assert len(_launches(fake_sky)) == 1
