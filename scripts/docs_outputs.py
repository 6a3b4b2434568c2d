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
"""

from __future__ import annotations

import argparse
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
    parser.add_argument("names", nargs="*", help=f"outputs to make: {', '.join(OUTPUTS)}")
    parser.add_argument("--check", action="store_true", help="only say which pages differ")
    args = parser.parse_args()
    unknown = sorted(set(args.names) - OUTPUTS.keys())
    if unknown:
        parser.error(f"no output {unknown[0]!r}; known: {', '.join(OUTPUTS)}")
    stale = 0
    for name in args.names or list(OUTPUTS):
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
