"""Each fix the cloud fault soak guards, taken back out of the source (issue #58).

The fixes are patches in one file, `tests/guarded_fixes.diff` (a `# fix:` entry each: the soak
that must catch it, the fix's own test, and a unified diff whose `-` lines are the lines it
guards). `revert` copies the `mncloud/` package into a folder and applies one patch there with
`git apply`; `check` runs, in a fresh interpreter whose `mncloud` is that copy, the soak on a
fixed set of seeds with every fault kind (`tests/test_soak_mutations.py::test_soak_seeds`) and
the fix's own test. A fix counts as guarded when every seed reports a violation and its own
test fails; an entry of soak `none` (`OWN_TEST_ONLY`: no soak reaches it yet, its `# unsoaked:`
line says why) is checked by its own test only. The short form (3 seeds × 12 faults) is in
the suite; `bench/soak_mutations.py`
runs the long one (10 × 20) and prints the fix × seeds table of docs/benchmarks.md.

The soaks (`soak_once`): `controller` (a deadline run, `tests/cloudsoak.py`), `plain`
(`tests/plainsoak.py`), each on a managed job or, `-group`, a job group (`--recovery node`; under
the controller with `--max-restarts 0`, so that the failed node ends the run).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[1]
FIXES_FILE = Path(__file__).with_name("guarded_fixes.diff")
SOAKS = ("controller", "controller-group", "plain", "plain-group")
OWN_TEST_ONLY = "none"
"""The soak of a fix no soak reaches yet (its entry's `# unsoaked:` says why): its own test only."""
RUN_ENV = "MNCLOUD_SOAK_RUN"
"""What `test_soak_seeds` runs, as JSON (soak, seeds, faults, out): set by `check` only."""


@dataclass(frozen=True)
class Fix:
    name: str
    soak: str
    """The soak that must catch it (one of `SOAKS`; `OWN_TEST_ONLY`: none, `unsoaked` why)."""
    test: str
    """The fix's own test (a pytest node id): it must fail with the fix taken out."""
    why: str
    patch: str
    """The unified diff that takes the fix out (against the repository's root)."""
    unsoaked: str = ""


def fixes(path: Path = FIXES_FILE) -> dict[str, Fix]:
    """The entries of `guarded_fixes.diff`, by name."""
    found: dict[str, Fix] = {}
    for entry in re.split(r"^# fix: ", path.read_text(), flags=re.M)[1:]:
        name, _, rest = entry.partition("\n")
        fields = dict(re.findall(r"^# (soak|test|why|unsoaked): (.*)$", rest, flags=re.M))
        patch = rest[rest.index("--- a/") :]
        fix = Fix(name.strip(), fields["soak"], fields["test"], fields["why"], patch,
                  fields.get("unsoaked", ""))  # fmt: skip
        own_only = fix.soak == OWN_TEST_ONLY and fix.unsoaked
        if (fix.soak not in SOAKS and not own_only) or fix.name in found:
            raise ValueError(f"{path.name}: entry {fix.name!r}: soak {fix.soak!r} or name")
        found[fix.name] = fix
    return found


def revert(fix: Fix, folder: Path) -> Path:
    """A copy of `mncloud/` under `folder` with `fix` taken out; AssertionError, naming the
    fix, when its patch no longer applies (the guarded lines moved: mend the entry)."""
    shutil.copytree(REPO / "mncloud", folder / "mncloud",
                    ignore=shutil.ignore_patterns("__pycache__"))  # fmt: skip
    done = subprocess.run(["git", "apply", "--whitespace=nowarn", "-"], input=fix.patch,
                          cwd=folder, capture_output=True, text=True)  # fmt: skip
    if done.returncode:
        raise AssertionError(f"fix {fix.name!r}: its patch no longer applies: {done.stderr}")
    return folder


@dataclass
class Verdict:
    caught: dict[int, str]
    """Per seed, its first violation ('' for none)."""
    own_test_failed: bool | None
    """None: no own test was run."""
    output: str


def check(
    fix: Fix | None, soak: str, seeds: list[int], faults: int, folder: Path, *, own: bool = True
) -> Verdict:
    """The soak `soak` on `seeds` (`faults` each, every kind), and (`own`) the fix's own test,
    with `fix` taken out of a copy of the package under `folder` (None: the source as it is).
    A fix of `OWN_TEST_ONLY`: its own test only (no seed caught it)."""
    folder.mkdir(parents=True, exist_ok=True)
    path = [str(revert(fix, folder / "src"))] if fix is not None else []
    out, xml = folder / "seeds.json", folder / "tests.xml"
    run = {"soak": soak, "seeds": seeds, "faults": faults, "out": str(out)}
    env = {**os.environ, RUN_ENV: json.dumps(run),
           "PYTHONPATH": os.pathsep.join([*path, str(REPO)])}  # fmt: skip
    soaked = fix is None or fix.soak != OWN_TEST_ONLY
    tests = ["tests/test_soak_mutations.py::test_soak_seeds"] if soaked else []
    if own and fix is not None:
        tests.append(fix.test)
    # -P and --import-mode=append: `mncloud` is the copy's, not the repository's
    argv = [sys.executable, "-P", "-m", "pytest", *tests, "-n", "0", "-q", "-p",
            "no:cacheprovider", "--import-mode=append", f"--junitxml={xml}",
            f"--basetemp={folder / 'tmp'}"]  # fmt: skip
    done = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True)
    output = done.stdout[-4000:] + done.stderr[-2000:]
    if not soaked:
        out.write_text("{}")
    if not out.exists():
        raise AssertionError(f"the soak did not run ({fix and fix.name}): {output}")
    caught = {int(seed): found for seed, found in json.loads(out.read_text()).items()}
    failed = _failed(xml, fix.test) if own and fix is not None else None
    return Verdict(caught, failed, output)


def _failed(xml: Path, node: str) -> bool:
    """Whether test `node` (any of its parameters) failed or erred in the JUnit report `xml`;
    AssertionError when it did not run (skipped or not collected: it proves nothing)."""
    name = node.rpartition("::")[2]
    ran = [case for case in ET.parse(xml).iter("testcase")
           if case.get("name", "").partition("[")[0] == name
           and case.find("skipped") is None]  # fmt: skip
    if not ran:
        raise AssertionError(f"{node} did not run")
    return any(case.find("failure") is not None or case.find("error") is not None for case in ran)


def soak_once(
    fake: Any,
    soak: str,
    script: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    seed: int,
    faults: int,
) -> list[str]:
    """One seed of soak `soak` (every fault kind) on the installed `fake` (the `fake_sky`
    fixture's, emptied: a second `install` would not replace the first), a fresh home: its
    violations."""
    from tests.cloudsoak import SECRET, soak_state
    from tests.cloudsoak import soak as controller_soak
    from tests.fakesky import FakeSky, server

    folder = tmp_path / f"{soak}-{seed}"
    folder.mkdir()
    group = soak.endswith("-group")
    with monkeypatch.context() as mp:
        mp.setenv("MNCLOUD_HOME", str(folder / "home"))
        mp.setenv("SOAK_TOKEN", SECRET)
        fake.__dict__.clear()
        fake.__dict__.update(FakeSky().__dict__)
        mp.setattr(server, "INSTALLED", fake)
        if soak.startswith("plain"):
            from tests.plainsoak import plain_soak

            return plain_soak(fake, mp, folder, script, seed, faults, group=group)
        if group:
            from mncloud.render import jobgroup

            script.write_text("from mncloud.train import Replicas\nreplicas = Replicas({})\n")
            mp.setattr(jobgroup, "require_bucket", lambda _spec: None)
        # a job group with no restart left: a failed node ends the run, its rest must not train on
        flags = {"recovery": "node", "max_restarts": 0} if group else {}
        state = soak_state(script, folder, **flags)
        return controller_soak(fake, mp, folder, state, seed, faults).violations
