"""The mutation check of the cloud fault soak (issue #58), short form: each fix the soak guards
taken back out of a copy of the source (`tests/guarded_fixes.diff`, `tests/mutations.py`), the
soak run there with every fault kind on 3 seeds of 12 faults, and each seed must catch it; the
fix's own test must fail there too. All waits are on fake clocks. `bench/soak_mutations.py`
runs the long form (10 seeds × 20 faults) and prints the fix × seeds table."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.fakesky import FakeSky
from tests.mutations import OWN_TEST_ONLY, RUN_ENV, SOAKS, check, fixes, revert, soak_once
from tests.test_skypilot import script  # noqa: F401 - a fixture

pytestmark = pytest.mark.catalog
SEEDS = [0, 1, 2]
FAULTS = 12


@pytest.mark.parametrize("name", list(fixes()))
def test_each_fix_taken_out_of_the_source_is_caught_in_every_seed(
    name: str, tmp_path: Path
) -> None:
    fix = fixes()[name]
    verdict = check(fix, fix.soak, SEEDS, FAULTS, tmp_path)
    missed = [seed for seed, found in verdict.caught.items() if not found]
    for seed, found in verdict.caught.items():
        print(f"{name}: seed {seed}: {found[:160] or 'not caught'}")
    assert verdict.own_test_failed, f"{fix.test} passes with {name!r} taken out"
    if fix.soak == OWN_TEST_ONLY:  # no soak reaches it yet (`fix.unsoaked`): its test only
        return
    assert sorted(verdict.caught) == SEEDS, verdict.caught
    assert not missed, f"{name!r} taken out: seeds {missed} of the {fix.soak} soak did not catch it"


@pytest.mark.parametrize("soak", SOAKS)
def test_the_short_form_finds_nothing_with_every_fix_in(
    soak: str,
    script: Path,  # noqa: F811
    fake_sky: FakeSky,  # emptied for each seed
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The control: the same soaks and seeds, nothing taken out, find nothing."""
    for seed in SEEDS:
        found = soak_once(fake_sky, soak, script, tmp_path, monkeypatch, seed, FAULTS)
        assert not found, (seed, found)


def test_every_fix_names_a_soak_and_a_test_and_guards_lines(tmp_path: Path) -> None:
    """Each entry of `guarded_fixes.diff` is whole: a soak, an own test that exists, a patch
    of the package that changes lines (takes the fix out, or puts the old path back) and
    still applies to the source as it is (`revert` names the entry whose lines moved)."""
    for n, fix in enumerate(fixes().values()):
        revert(fix, tmp_path / str(n))
        path, _, test = fix.test.partition("::")
        assert f"def {test}(" in (Path(__file__).parents[1] / path).read_text(), fix.name
        changed = [line for line in fix.patch.splitlines()
                   if line[:1] in ("+", "-") and line[:3] not in ("+++", "---")]  # fmt: skip
        assert changed and "+++ b/mncloud/" in fix.patch, fix.name


RUN = os.environ.get(RUN_ENV)


@pytest.mark.skipif(not RUN, reason="one reverted soak's seeds: `tests/mutations.check` runs it")
def test_soak_seeds(
    script: Path,  # noqa: F811
    fake_sky: FakeSky,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The seeds `RUN_ENV` names, of its soak, on this interpreter's `mncloud` (a reverted
    copy): per seed its first violation (an error the run raised is one), written to the JSON
    file it names."""
    job = json.loads(RUN or "{}")
    found = {}
    for seed in job["seeds"]:
        try:
            violations = soak_once(fake_sky, job["soak"], script, tmp_path, monkeypatch, seed,
                                   job["faults"])  # fmt: skip
        except Exception as err:  # the reverted code broke the soak's run: caught as well
            violations = [f"the run raised {type(err).__name__}: {err}"]
        found[seed] = violations[0] if violations else ""
    Path(job["out"]).write_text(json.dumps(found))
