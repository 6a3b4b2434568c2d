"""Your first cloud run, followed as written (issue #60).

Every code block of docs/getting-started/first-cloud-run.md runs here in page order, marked
not-run or not (that marker is for tests/test_docs.py, whose project has no cloud), in one
world a reader's machine would be: the example project, SkyPilot's enabled clouds seeded
(`sky check` would have written them), the catalog snapshot, SkyPilot's SDK answered by
`tests/fakesky` (the cloud's VM API: nothing else is faked) and the GCS emulator for the bucket.
SkyPilot's own dry runs run for real.

- `mncloud …` runs through the CLI in-process (`docblocks.run_line`); `VAR=value` sets `$VAR`
  for the blocks after it.
- `sky jobs queue` runs SkyPilot's own command line against the fake; the other `sky` commands
  (`check`, `status`, `api stop`: they would reach a cloud or the API server's HTTP routes) are
  parsed by SkyPilot's command line (`--help` appended): a command or option that does not exist
  fails.
- A bash line must exit 0; a console block's command must exit as its output says
  (`docblocks.exit_shown`) and print what the page shows, volatile figures (seconds ago, a
  table's rule length) aside. The page's outputs are regenerated from this walk:
  `python scripts/docs_outputs.py walk` runs it with `MNCLOUD_WALK_RECORD=FILE`, which records
  each console command's output there instead of comparing it.
- Each `up` that launches gets its job's tasks scripted STARTING then RUNNING in the fake, as
  SkyPilot's queue would show a job that started.
"""

from __future__ import annotations

import json
import os
import re
import shlex
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests import docblocks
from tests.docblocks import ROOT, Block
from tests.fakesky import FakeSky
from tests.skyseed import sky_enabled_clouds  # noqa: F401 - a fixture
from tests.test_docs import project  # noqa: F401 - a fixture

pytestmark = pytest.mark.catalog

PAGE = ROOT / "docs" / "getting-started" / "first-cloud-run.md"
#: Where the reader's checkout stands in the outputs the page shows.
READER = "/home/you/mncloud"
#: `sky` commands the fake answers (through SkyPilot's own command line); others are parsed only.
SKY_RUNS = {("jobs", "queue")}
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


@dataclass(frozen=True)
class Step:
    """One command of the page as the walk ran it."""

    block: Block
    line: int
    command: str
    code: int
    output: str
    shown: str | None
    """The output the page shows after it (console blocks), else None."""

    @property
    def where(self) -> str:
        return f"{self.block.page.relative_to(ROOT)}:{self.line}"


def cleaned(output: str, proj: Path) -> str:
    """What a command printed as the page shows it: no terminal codes (SkyPilot's spinner),
    the reader's checkout for the test's project, lines stripped on the right, and the task
    YAML a dry run prints elided (`…`: `mncloud render` shows it)."""
    text = ANSI.sub("", output).replace(str(proj), READER)
    lines = [line.rstrip() for line in text.strip().splitlines()]
    start = next((i for i, line in enumerate(lines) if line.startswith("# Rendered by")), None)
    end = next(
        (i for i in range(len(lines) - 1, -1, -1) if re.match(r"[\w-]+: dry run", lines[i])), None
    )
    if start is not None and end is not None and start < end:
        lines[start:end] = ["…"]
    return "\n".join(line for line in lines if line or not lines)


def steady(text: str) -> str:
    """Text with what changes from run to run masked: seconds (`3s ago`, `< 1 sec`) and the
    length of a table's rules, which follows its cells' widths."""
    text = re.sub(r"\d+(\.\d+)?s\b", "Ns", text)
    text = re.sub(r"< \d+ sec", "Ns", text)
    return re.sub(r"[━─┄]+", "━", text)


def sky_line(words: list[str]) -> tuple[int, str]:
    """A `sky …` line through SkyPilot's own command line: run against the fake where it
    answers it (`SKY_RUNS`), else parsed only (`--help` appended: a command or option that does
    not exist is a usage error, exit 2)."""
    from click.testing import CliRunner
    from sky.client.cli import command

    runs = tuple(w for w in words if not w.startswith("-"))[:2] in SKY_RUNS
    result = CliRunner().invoke(command.cli, words if runs else [*words, "--help"])
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result.exit_code, result.output


def run(line: str, proj: Path, env: dict[str, str]) -> tuple[int, str]:
    """One line of the page: `mncloud …` or `sky …`; the walk runs nothing else."""
    words = shlex.split(line)
    if words[0] == "sky":
        return sky_line(words[1:])
    assert words[0] == "mncloud", f"the walk runs mncloud and sky commands only: `{line}`"
    return docblocks.run_line(line, proj, env)


def walk(fake: FakeSky, proj: Path) -> Iterator[Step]:
    """Every command of the page, in order, as it ran."""
    env: dict[str, str] = {}
    for block in docblocks.blocks(PAGE):
        if block.lang == "bash":
            lines = [(n, line.split(" #")[0].strip()) for n, line in docblocks.shell_lines(block)]
            commands = [(n, line, None) for n, line in lines if line]
        elif block.lang == "console":
            commands = [
                (block.line + 1, command, shown)
                for command, shown in docblocks.console_steps(block)
            ]
        else:
            assert not block.is_code, f"{block.where}: the walk runs bash and console blocks only"
            continue
        for n, line, shown in commands:
            if m := re.fullmatch(r"([A-Z_]+)=(\S+)", line):
                env[m.group(1)] = m.group(2)
                continue
            before = set(fake.jobs)
            code, output = run(line, proj, env)
            for job_id in set(fake.jobs) - before:  # launched: its tasks start
                fake.script(job_id, [_status("STARTING"), _status("RUNNING")])
            yield Step(block, n, line, code, cleaned(output, proj), shown)


def _status(name: str) -> object:
    from sky.jobs import ManagedJobStatus

    return ManagedJobStatus[name]


@pytest.mark.slow
def test_first_cloud_run_as_written(
    project: Path,  # noqa: F811 - the fixture imported above
    fake_sky: FakeSky,
    sky_enabled_clouds: list[str],  # noqa: F811 - the fixture imported above
    gcs_env: object,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The page, block by block: every command exists and exits as the page says, and prints
    what the page shows (or, with `MNCLOUD_WALK_RECORD`, the outputs are recorded for
    `scripts/docs_outputs.py walk`)."""
    record = os.environ.get("MNCLOUD_WALK_RECORD")
    steps = list(walk(fake_sky, project))
    assert len(steps) >= 15, [s.command for s in steps]
    for step in steps:
        expected = 0 if step.shown is None else docblocks.exit_shown(step.shown)
        assert step.code == expected, (
            f"{step.where}: `{step.command}` exited {step.code}, the page says {expected}:\n"
            f"{step.output[-3000:]}"
        )
    shown = [s for s in steps if s.shown is not None]
    if record:
        outputs = [{"line": s.block.line, "command": s.command, "output": s.output} for s in shown]
        Path(record).write_text(json.dumps(outputs, indent=1))
        return
    for step in shown:
        assert step.shown is not None
        assert docblocks.shown(steady(step.shown), steady(step.output)), (
            f"{step.where}: `{step.command}` printed\n{step.output}\nthe page shows\n"
            f"{step.shown}\n(regenerate: python scripts/docs_outputs.py walk)"
        )
    with capsys.disabled():
        print(f"\nfirst cloud run: {len(steps)} commands followed, {len(shown)} outputs checked")


def test_the_page_launches_small_first_and_plans_what_up_launches() -> None:
    """The first launch is one spot GPU under a dollar an hour; every `up` that launches is
    preceded by a `plan` of the same script, market and bucket (what `up` would launch)."""
    commands = [
        line
        for block in docblocks.blocks(PAGE)
        for line in (
            [c for c, _ in docblocks.console_steps(block)]
            if block.lang == "console"
            else [x for _, x in docblocks.shell_lines(block)]
        )
        if line.startswith("mncloud ")
    ]
    ups = [c for c in commands if c.startswith("mncloud up ") and "--dryrun" not in c]
    first = shlex.split(ups[0])
    assert first[first.index("--gpus") + 1].endswith(":1") and "--nodes" not in first
    assert "--spot" in first and float(first[first.index("--max-hourly") + 1]) <= 1
    plans = [shlex.split(c) for c in commands if c.startswith("mncloud plan ")]
    for up in map(shlex.split, ups):
        market = {f: up[up.index(f) + 1] for f in ("--gpus", "--cloud", "--bucket") if f in up}
        same = [
            p for p in plans
            if p[2] == up[2] and all(p[p.index(f) + 1] == v for f, v in market.items() if f in p)
            and set(market) <= set(p)
        ]  # fmt: skip
        assert same, f"no `mncloud plan {up[2]}` with the market of `{' '.join(up)}`"


def test_a_sky_command_that_does_not_exist_fails_the_walk() -> None:
    """SkyPilot's own command line parses the page's `sky` lines: a misspelt command or option
    exits 2, as the walk then reports; one that exists is only parsed (exit 0)."""
    assert sky_line(["check", "gcp"])[0] == 0
    assert sky_line(["api", "stop"])[0] == 0
    code, out = sky_line(["jobs", "queu"])
    assert code == 2 and "No such command" in out
    assert sky_line(["status", "--nope"])[0] == 2
