"""The mutation check of the cloud fault soak (issue #52), short form: each fix the soak
guards taken back out in turn (`tests/mutations.py`), and the soak must fail for it, in one of
a few seeds of a dozen faults drawn from those about the fix. All waits are on fake clocks.
`bench/soak_mutations.sh` runs the long form (every fault kind, ≥ 10 seeds × ≥ 20 faults)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.fakesky import FakeSky
from tests.mutations import MUTATIONS, Mutation, soak_once
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
    keep = Mutation(lambda _mp: None, (), group=True, plain=plain)
    assert soak_once(fake_sky, keep, script, tmp_path, monkeypatch, 0, FAULTS) == []


LONG_SEEDS = int(os.environ.get("MNCLOUD_MUTATION_SEEDS", "0"))
LONG_FAULTS = int(os.environ.get("MNCLOUD_MUTATION_FAULTS", "20"))
_KEEP = {
    "(none: controller, job)": Mutation(lambda _mp: None, ()),
    "(none: controller, group)": Mutation(lambda _mp: None, (), group=True),
    "(none: plain up, group)": Mutation(lambda _mp: None, (), group=True, plain=True),
}


@pytest.mark.skipif(not LONG_SEEDS, reason="the long form: bench/soak_mutations.sh")
@pytest.mark.parametrize("name", [*_KEEP, *MUTATIONS])
def test_long_form(
    name: str,
    script: Path,  # noqa: F811
    fake_sky: FakeSky,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Every fault kind, `MNCLOUD_MUTATION_SEEDS` seeds of `MNCLOUD_MUTATION_FAULTS` faults:
    the seeds that caught the mutation (a control, nothing taken out: none may)."""
    mutation = _KEEP.get(name) or MUTATIONS[name]
    caught = []
    for seed in range(LONG_SEEDS):
        found = soak_once(fake_sky, mutation, script, tmp_path, monkeypatch, seed, LONG_FAULTS)
        if found:
            caught.append((seed, found[0]))
    line = (f"{name}: {LONG_SEEDS} seeds x {LONG_FAULTS} faults, caught by "
            f"{len(caught)}: {[seed for seed, _ in caught]}"
            + (f"; first: {caught[0][1][:160]}" if caught else ""))  # fmt: skip
    print(line)
    report = os.environ.get("MNCLOUD_MUTATION_REPORT")
    if report:
        with open(report, "a") as out:
            out.write(line + "\n")
    if name in _KEEP:
        assert caught == []
