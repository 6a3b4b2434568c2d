"""Regenerate the command output the docs show, so none of it is pasted by hand.

A page marks each shown output with the comment `<!-- output: NAME -->` on the line before its
fence; this script runs NAME's command and writes what it printed into that fence, in every page
that shows it (README.md and docs/):

    .venv/bin/python scripts/docs_outputs.py            # every output (the demo trains ~1 min)
    .venv/bin/python scripts/docs_outputs.py plan-steps # one
    .venv/bin/python scripts/docs_outputs.py --check    # exit 1 where a page differs

The plan needs SkyPilot's catalog: the snapshot `MNCLOUD_CATALOG_DIR` names, else
`../shared/catalogs` beside the checkout (as the tests use it). tests/test_docs.py
checks the plan's output on every run (it is fast); the demo's is regenerated here only.

`walk` is every output of a page that a test follows block by block (`WALKS`: "Your first
cloud run", against the SkyPilot fake): each fence marked `<!-- output: walk -->` is a console
block whose `$ command` lines stay as the page has them and whose outputs are what the test's
walk recorded (it runs with `MNCLOUD_WALK_RECORD=FILE`); without the recording, the same test
checks that the page shows them.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUTPUT = re.compile(r"^<!-- output: ([\w-]+) -->\n```(\w*)\n(.*?)^```$", re.M | re.S)
MNCLOUD = [sys.executable, "-m", "mncloud"]

#: The plan the planning guide shows: a 1.3B-parameter model, 8,192 tokens per GPU per step.
PLAN_STEPS = [
    "plan", "--gpus", "H100:8,A100-80GB:8", "--steps", "20000",
    "--params", "1.3e9", "--tokens-per-step", "8192", "--on-demand", "--top", "2",
]  # fmt: skip
#: The README's first command, less `scripts/setup.sh`.
DEMO = [
    "up", "examples/train_ddp.py", "--cloud", "local", "--nodes", "2", "--gpus", "cpu:2",
    "--name", "demo", "--recovery", "gang", "--chaos-preempt-after", "8s",
]  # fmt: skip


def _env(home: str) -> dict[str, str]:
    env = {**os.environ, "MNCLOUD_HOME": home, "COLUMNS": "80", "NO_COLOR": "1", "TERM": "dumb"}
    env["SKY_RUNTIME_DIR"] = str(Path(home) / "sky")  # SkyPilot's state as on a fresh machine
    beside = ROOT.parent / "shared" / "catalogs"
    if not env.get("MNCLOUD_CATALOG_DIR") and beside.is_dir():
        env["MNCLOUD_CATALOG_DIR"] = str(beside)
    return env


def run(args: list[str]) -> str:
    """`mncloud ARGS` in a fresh home, 80 columns, no colour: its output, stripped."""
    with tempfile.TemporaryDirectory() as home:
        done = subprocess.run(
            MNCLOUD + args, cwd=ROOT, env=_env(home), capture_output=True, text=True, check=False
        )
    if done.returncode != 0:
        raise SystemExit(f"mncloud {' '.join(args)} failed ({done.returncode}): {done.stderr}")
    return "\n".join(line.rstrip() for line in done.stdout.strip().splitlines())


def plan_steps() -> str:
    """The plan, less the note that no cloud is enabled here (it is about this machine)."""
    out = run(PLAN_STEPS)
    return out.split("\nno cloud is enabled", 1)[0]


def demo_summary() -> str:
    """The demo's closing figures, from `restarts` to the reference's verdict."""
    lines = run(DEMO).splitlines()
    first = next(i for i, line in enumerate(lines) if line.startswith("restarts"))
    last = next(i for i, line in enumerate(lines) if line.startswith("reference"))
    return "\n".join(lines[first : last + 1])


OUTPUTS: dict[str, Callable[[], str]] = {"plan-steps": plan_steps, "demo-summary": demo_summary}


#: Pages a test follows block by block, and that test: their `walk` outputs come from it.
WALKS = {
    "docs/getting-started/first-cloud-run.md": (
        "tests/test_first_cloud_run.py::test_first_cloud_run_as_written"
    ),
}
WALK = "walk"


def walk_recorded(test: str) -> list[dict[str, object]]:
    """What each console command of a walked page printed, as the test recorded it."""
    with tempfile.TemporaryDirectory() as folder:
        record = Path(folder) / "walk.json"
        done = subprocess.run(
            [sys.executable, "-m", "pytest", test, "-n", "0", "-q", "-p", "no:cacheprovider"],
            cwd=ROOT, env={**os.environ, "MNCLOUD_WALK_RECORD": str(record)},
            capture_output=True, text=True, check=False,
        )  # fmt: skip
        if done.returncode != 0 or not record.exists():
            raise SystemExit(f"{test} failed ({done.returncode}):\n{done.stdout[-4000:]}")
        return list(json.loads(record.read_text()))


def write_walk(page: Path, recorded: list[dict[str, object]]) -> bool:
    """Each `walk` fence of PAGE with the recorded outputs after its commands; changed?"""
    old = page.read_text()
    outputs = {(r["line"], r["command"]): str(r["output"]) for r in recorded}

    def fence(m: re.Match[str]) -> str:
        if m.group(1) != WALK:
            return m.group(0)
        line = old.count("\n", 0, m.start()) + 2  # the opening fence's, 1-based
        commands = [c.strip() for c in re.findall(r"^\$ (.*)$", m.group(3), re.M)]
        missing = [c for c in commands if (line, c) not in outputs]
        if missing:
            raise SystemExit(f"{page.relative_to(ROOT)}:{line}: the walk ran no {missing[0]!r}")
        body = "\n".join(f"$ {c}\n{outputs[(line, c)]}".rstrip() for c in commands)
        return f"<!-- output: {WALK} -->\n```{m.group(2)}\n{body}\n```"

    new = OUTPUT.sub(fence, old)
    if new != old:
        page.write_text(new)
    return new != old


def walks(check: bool) -> int:
    """Regenerate every walked page's outputs (or, with `check`, let its test compare them)."""
    stale = 0
    for page, test in WALKS.items():
        if check:
            done = subprocess.run(
                [sys.executable, "-m", "pytest", test, "-n", "0", "-q", "-p", "no:cacheprovider"],
                cwd=ROOT, capture_output=True, text=True, check=False,
            )  # fmt: skip
            if done.returncode != 0:
                stale += 1
                print(f"{page}: output walk differs ({test} fails)", file=sys.stderr)
        elif write_walk(ROOT / page, walk_recorded(test)):
            print(f"{page}: walk regenerated")
    return stale


def pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def shown(name: str) -> list[tuple[Path, str]]:
    """(page, the output it shows) for every page that shows NAME."""
    return [
        (page, m.group(3).rstrip("\n"))
        for page in pages()
        for m in OUTPUT.finditer(page.read_text())
        if m.group(1) == name
    ]


def write(name: str, text: str) -> list[Path]:
    """Put TEXT into every fence marked NAME; the pages it changed."""
    changed = []
    for page in pages():
        old = page.read_text()
        new = OUTPUT.sub(
            lambda m: (
                f"<!-- output: {m.group(1)} -->\n```{m.group(2)}\n{text}\n```"
                if m.group(1) == name
                else m.group(0)
            ),
            old,
        )
        if new != old:
            page.write_text(new)
            changed.append(page)
    return changed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    known = [*OUTPUTS, WALK]
    parser.add_argument("names", nargs="*", help=f"outputs to make: {', '.join(known)}")
    parser.add_argument("--check", action="store_true", help="only say which pages differ")
    args = parser.parse_args()
    unknown = sorted(set(args.names) - set(known))
    if unknown:
        parser.error(f"no output {unknown[0]!r}; known: {', '.join(known)}")
    names = args.names or known
    stale = walks(args.check) if WALK in names else 0
    for name in (n for n in names if n != WALK):
        text = OUTPUTS[name]()
        if args.check:
            for page, has in shown(name):
                if has != text:
                    stale += 1
                    print(f"{page.relative_to(ROOT)}: output {name} differs", file=sys.stderr)
        else:
            for page in write(name, text):
                print(f"{page.relative_to(ROOT)}: {name} regenerated")
    return 1 if stale else 0


if __name__ == "__main__":
    raise SystemExit(main())
