"""The code blocks and command lines of README.md and docs/, as tests/test_docs.py reads them.

A fence is a code block when its language is `bash`, `console` or `python`, or it is a
`yaml title="mncloud.yaml"`; each is run by the suite unless a line just before its fence says
why not, `<!-- not-run: reason -->`. `text` (and other languages) are output or data; a fence
marked `<!-- output: NAME -->` shows output `scripts/docs_outputs.py` regenerates (the two
markers may stand one above the other, output last). A fence without a language is read by its
first line: `$ …` is console, a command (`mncloud …`, `python …`) bash, anything else text.

Running them (`run_line`, `shown`, `exit_shown`): a `mncloud …` line runs in-process through
the CLI as the console script runs it, anything else in bash. A bash block's lines must exit 0;
a console block's `$ command` must print what the page shows after it (`…` stands for anything)
and exit as the page says: 2 when what it shows starts with `error:` (a refusal: one line,
exit 2), else 0.
"""

from __future__ import annotations

import os
import re
import shlex
import string
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FENCE = re.compile(r"^(\s*)(`{3,})(.*)$")
NOT_RUN = re.compile(r"^\s*<!-- not-run: (.+?) -->\s*$")
OUTPUT = re.compile(r"^\s*<!-- output: ([\w-]+) -->\s*$")
CODE = {"bash", "console", "python"}


@dataclass(frozen=True)
class Block:
    """One fenced block: where it is, its language and text, and what the line before says."""

    page: Path
    line: int  # the opening fence's, 1-based
    lang: str
    info: str
    text: str
    not_run: str | None
    output: str | None

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"

    @property
    def is_code(self) -> bool:
        return self.lang in CODE or (self.lang == "yaml" and 'title="mncloud.yaml"' in self.info)


def pages() -> list[Path]:
    """README.md and every page under docs/."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def blocks(page: Path) -> Iterator[Block]:
    lines = page.read_text().splitlines()
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        indent, ticks, info = m.groups()
        body, j = [], i + 1
        while j < len(lines) and not lines[j].strip().startswith(ticks):
            body.append(lines[j][len(indent) :] if lines[j].startswith(indent) else lines[j])
            j += 1
        out = OUTPUT.match(lines[i - 1]) if i else None
        above = i - 2 if out else i - 1  # not-run stands above an output marker, or alone
        nr = NOT_RUN.match(lines[above]) if above >= 0 else None
        yield Block(
            page=page,
            line=i + 1,
            lang=info.split()[0] if info.strip() else _guess(body),
            info=info,
            text="\n".join(body) + "\n",
            not_run=nr.group(1) if nr else None,
            output=out.group(1) if out else None,
        )
        i = j + 1


def _guess(body: list[str]) -> str:
    """The language of a fence that names none, from its first line."""
    first = next((line.strip() for line in body if line.strip()), "")
    if first.startswith("$ "):
        return "console"
    if re.match(r"(mncloud|python|bash|sky|pip|\.venv/bin/\w+) ", first):
        return "bash"
    return "text"


def all_blocks() -> list[Block]:
    return [b for page in pages() for b in blocks(page)]


# ------------------------------------------------------------------ flags and keys named in pages

INLINE = re.compile(r"(?<!`)`([^`]+)`(?!`)")


def commands_in(text: str) -> Iterator[list[str]]:
    """Each `mncloud …` invocation in a line of shell, as words, up to `--`, `;`, `|` or `#`."""
    for part in re.split(r";|&&|\|\||\|(?!/)", text):
        words = part.replace("\\", " ").split()
        if "mncloud" not in words:
            continue
        words = words[words.index("mncloud") :]
        out = []
        for w in words:
            if w in ("--", "#") or w.startswith("#"):
                break
            out.append(w)
        yield out


def flag_words(words: list[str]) -> Iterator[str]:
    """The `--flags` among an invocation's words (`[--json]`, `--every=5s`: `--json`, `--every`)."""
    for w in words:
        w = w.strip("[]()")
        m = re.match(r"^(--[a-z][a-z0-9_-]*)", w)
        if m:
            yield m.group(1)


def shell_lines(block: Block) -> Iterator[tuple[int, str]]:
    """(line number, a logical line) of a bash or console block, `\\` continuations joined."""
    lines = block.text.splitlines()
    n = 0
    while n < len(lines):
        start, line = n, lines[n]
        while line.endswith("\\") and n + 1 < len(lines):
            n += 1
            line = line[:-1] + " " + lines[n]
        if block.lang == "console":
            line = line[2:] if line.startswith("$ ") else ""
        yield block.line + 1 + start, line
        n += 1


def named_in_prose(page: Path) -> Iterator[tuple[int, str]]:
    """(line, inline code) of every code span outside fences (a span may wrap a line)."""
    kept, in_fence = [], False
    for line in page.read_text().splitlines():
        fence = FENCE.match(line)
        kept.append("" if in_fence or fence else line)
        if fence:
            in_fence = not in_fence
    text = "\n".join(kept)
    for m in INLINE.finditer(text):
        yield text.count("\n", 0, m.start()) + 1, " ".join(m.group(1).split())


def split(line: str) -> list[str]:
    try:
        return shlex.split(line, comments=True)
    except ValueError:
        return line.split()


# ------------------------------------------------------------------------- running a line


def run_line(line: str, cwd: Path, env: dict[str, str]) -> tuple[int, str]:
    """One command line of a page: `mncloud …` in this process (the CLI as the console script
    runs it; SkyPilot imported once for all blocks, and a fake of its SDK, where a test
    installed one, answers it), anything else in bash. Its exit code and what it printed,
    stdout and stderr together. `$T` is the value of a `T=…` line before it (`env`)."""
    line = string.Template(line).safe_substitute(env)
    words = split(line) if line.startswith("mncloud ") else []
    if words:
        from typer.testing import CliRunner

        from mncloud.cli import app

        old = dict(os.environ)
        os.environ.update(env)
        try:
            result = CliRunner().invoke(app, words[1:], prog_name="mncloud")
        finally:
            os.environ.clear()
            os.environ.update(old)
        if result.exception is not None and not isinstance(result.exception, SystemExit):
            raise result.exception
        return result.exit_code, result.output
    done = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", line], cwd=cwd, env={**os.environ, **env},
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    return done.returncode, done.stdout + done.stderr


def shown(expected: str, got: str) -> bool:
    """Output as a page shows it: `…` stands for anything; runs of spaces are one space."""
    parts = [re.escape(" ".join(p.split())) for p in expected.split("…")]
    return re.fullmatch(".*?".join(parts), " ".join(got.split()), re.S) is not None


def exit_shown(expected: str) -> int:
    """The exit code a console block's shown output says: 2 for a refusal (`error: …`)."""
    return 2 if expected.lstrip().startswith("error:") else 0


def console_steps(block: Block) -> Iterator[tuple[str, str]]:
    """(command, the output the page shows after it) for each `$ command` of a console block."""
    for step in re.split(r"^\$ ", block.text, flags=re.M)[1:]:
        command, _, expected = step.partition("\n")
        yield command.strip(), expected.strip()
