"""The troubleshooting page quotes only messages mncloud prints (issue #60).

Each message the page cites is a `text` fence marked `<!-- message -->` on the line before.
In it, `…` stands for a value mncloud fills in, and a state in capitals that is a string of
mncloud's source (SkyPilot's `FAILED_NO_RESOURCE`, which mncloud passes on) stands for itself;
the CLI's `error: ` prefix is every refusal's. The rest, cut at each `…`, must be text mncloud's
string literals make (read with `ast`: a literal split over lines is one, an f-string's literal
parts are each one, docstrings are left out): inside one literal, or where one literal's text
ends and the next begins, as a message built of several does (`f"…({cause}); {advice}"` and the
advice's own literal). A message changed in the code, or misquoted, fails with the page's line.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from functools import cache
from pathlib import Path

import pytest

from tests.docblocks import ROOT

PAGE = ROOT / "docs" / "troubleshooting.md"
MESSAGE = re.compile(r"^<!-- message -->\n```text\n(.*?)^```$", re.M | re.S)
#: The sections the page must have: one per kind of trouble the issue names.
SECTIONS = ("Quota", "Capacity", "Credentials", "Preflight", "Bandwidth", "Storage",
            "Budget and deadline")  # fmt: skip
#: A message is anchored by one literal piece at least this long.
ANCHOR = 10


@cache
def literals() -> tuple[str, ...]:
    """Every string literal of `mncloud/` but docstrings, f-strings' literal parts each."""
    found: list[str] = []
    for path in sorted((ROOT / "mncloud").rglob("*.py")):
        tree = ast.parse(path.read_text())
        docs = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Expr)}
        for node in ast.walk(tree):
            text = node.value if isinstance(node, ast.Constant) else None
            if isinstance(text, str) and id(node) not in docs and "\0" not in text:
                found.append(text)
    return tuple(found)


@cache
def _joined() -> str:
    """The literals one after another, each between NULs (a C-speed search over all)."""
    return "\0" + "\0".join(literals()) + "\0"


def made_by_literals(piece: str) -> bool:
    """Whether `piece` is text of one literal, or of literals one after another: the first a
    literal's end, the last a literal's start, any between whole literals."""
    text, whole = _joined(), set(literals())
    if piece in text:
        return True
    ends = [False] * (len(piece) + 1)  # ends[i]: piece[:i] made, ending where a literal ends
    for i in range(1, len(piece)):
        head = piece[:i]
        ends[i] = f"{head}\0" in text or any(ends[j] and piece[j:i] in whole for j in range(1, i))
    return any(ends[j] and f"\0{piece[j:]}" in text for j in range(1, len(piece)))


def quoted(page: Path) -> Iterator[tuple[int, str]]:
    """(line, message) of every message the page cites."""
    text = page.read_text()
    for m in MESSAGE.finditer(text):
        line = text.count("\n", 0, m.start()) + 3  # the message's own line
        for offset, message in enumerate(m.group(1).splitlines()):
            if message.strip():
                yield line + offset, message.strip()


def pieces(message: str) -> list[str]:
    """The literal text of a quoted message, cut where a value goes."""
    message = message.removeprefix("error: ")
    states = {w for w in re.findall(r"\b[A-Z][A-Z_]{3,}\b", message) if w in literals()}
    for state in states:
        message = re.sub(rf"\b{state}\b", "…", message)
    return [p for p in message.split("…") if len(p.strip()) >= 3]


def unknown(message: str) -> list[str]:
    """The pieces of a quoted message that no literal of mncloud holds, and a missing anchor."""
    found = pieces(message)
    missing = [p for p in found if not made_by_literals(p)]
    if not any(len(p) >= ANCHOR for p in found):
        missing.append(f"(no literal piece of {ANCHOR}+ characters to anchor it)")
    return missing


def stale(page: Path) -> list[str]:
    return [
        f"{page.relative_to(ROOT)}:{line}: {piece!r} is in no message of mncloud/"
        for line, message in quoted(page)
        for piece in unknown(message)
    ]


@pytest.mark.slow  # parses every module of mncloud/ (about 2 s)
def test_every_message_the_page_quotes_is_one_mncloud_prints() -> None:
    messages = list(quoted(PAGE))
    assert len(messages) >= 25, messages
    problems = stale(PAGE)
    assert not problems, "\n".join(problems)


def test_the_page_covers_each_kind_of_trouble() -> None:
    headings = re.findall(r"^## (.+)$", PAGE.read_text(), re.M)
    missing = [s for s in SECTIONS if s not in headings]
    assert not missing, f"sections missing from {PAGE.name}: {missing}"
    for section in SECTIONS:  # each quotes at least one message
        body = PAGE.read_text().split(f"## {section}\n", 1)[1].split("\n## ", 1)[0]
        assert "<!-- message -->" in body, section


@pytest.mark.parametrize(
    ("message", "fails"),
    [
        ("error: cannot …: no capacity (…); try another --region or --cloud, --on-demand "
         "instead of spot, or later", False),
        ("error: cannot …: out of capacity (…); try another region", True),  # reworded
        ("managed job …: FAILED_NO_RESOURCE; …", False),
        ("managed job …: FAILED_NO_CAPACITY; …", True),  # not a state mncloud knows
        ("error: …", True),  # nothing to anchor it
    ],
)  # fmt: skip
def test_a_changed_or_misquoted_message_fails(
    message: str, fails: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    page = tmp_path / "troubleshooting.md"
    page.write_text(f"# T\n\n<!-- message -->\n```text\n{message}\n```\n")
    monkeypatch.setattr("tests.test_troubleshooting.ROOT", tmp_path)
    found = stale(page)
    assert bool(found) is fails, found
    if fails:
        assert found[0].startswith("troubleshooting.md:5: ")
