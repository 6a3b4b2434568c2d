"""The mutation check of the cloud fault soak (issue #52), short form: each fix the soak
guards taken back out in turn (`tests/mutations.py`), and the soak must fail for it, in one of
a few seeds of a dozen faults drawn from those about the fix. All waits are on fake clocks.
`bench/soak_mutations.sh` runs the long form (every fault kind, ≥ 10 seeds × ≥ 20 faults)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.fakesky import FakeSky
from tests.mutations import MUTATIONS, soak_once
from tests.test_skypilot import script  # noqa: F401 - a fixture

pytestmark = pytest.mark.catalog
SEEDS = 4
FAULTS = 12


@pytest.mark.parametrize("name", list(MUTATIONS))
def test_the_soak_fails_with_each_guarded_fix_taken_out(
    name: str,
    script: Path,  # noqa: F811
    fake_sky: FakeSky,  # emptied for each seed
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    mutation = MUTATIONS[name]
    for seed in range(SEEDS):
        found = soak_once(
            fake_sky, mutation, script, tmp_path, monkeypatch, seed, FAULTS, menu=mutation.menu
        )
        if found:
            print(f"{name}: seed {seed} caught it: {found[0]}")
            return
    pytest.fail(f"{name} taken out: none of {SEEDS} seeds of the soak failed")


@pytest.mark.parametrize("plain", [False, True], ids=["controller", "plain"])
def test_the_short_form_passes_with_every_fix_in(
    plain: bool,
    script: Path,  # noqa: F811
    fake_sky: FakeSky,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The control: the same soak, nothing taken out, finds nothing (a job group here, the
    harder case)."""
    from tests.mutations import Mutation

    keep = Mutation(lambda _mp: None, (), group=True, plain=plain)
    assert soak_once(fake_sky, keep, script, tmp_path, monkeypatch, 0, FAULTS) == []
