"""The documentation site (issue #53): built strictly, references complete, examples run.

- `mkdocs build --strict` into a temporary folder, once for the module: no broken link or
  anchor, every page in the nav, nothing fetched (the site builds offline).
- The references are generated from the code (scripts/docs_reference.py); here every command
  and option of the Typer app, every `mncloud.yaml` key and every public name of `mncloud.train`
  and `mncloud.storage` is checked to be on its built page, every flag to have help text and
  every key a docstring.
- Every code block of README.md and docs/ is run, or marked `<!-- not-run: reason -->`; the
  counts are printed. A page that names a flag or key that no longer exists fails with the
  page, the line and the name.
- The built home page and one guide open in the real browser tests/test_ui.py uses.
"""

from __future__ import annotations

import functools
import html
import http.server
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import yaml

from mncloud.options import FLAG_ONLY, YAML_KEYS
from tests import docblocks
from tests.docblocks import ROOT, Block

#: SkyPilot's catalog snapshot (conftest sets it from ../shared/catalogs beside the checkout);
#: the folder beside it holds the spot traces `mncloud replay` blocks read as ../shared/traces.
_SNAPSHOT = os.environ.get("MNCLOUD_CATALOG_DIR")
CATALOG = Path(_SNAPSHOT) if _SNAPSHOT else None


def _load(name: str) -> Any:
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


reference = _load("docs_reference")


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The site, built strictly (`--strict`: a warning fails) into a temporary folder."""
    out = tmp_path_factory.mktemp("site")
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(out)],
        cwd=ROOT,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return out


def test_the_site_builds_strictly_and_fetches_nothing(site: Path) -> None:
    home = (site / "index.html").read_text()
    assert "fonts.googleapis" not in home and "fonts.gstatic" not in home
    for page in site.rglob("*.html"):
        for src in re.findall(
            r'<(?:script|link)[^>]+(?:src|href)="(https?:[^"]+)"', page.read_text()
        ):
            pytest.fail(f"{page.relative_to(site)} loads {src}: the site must build offline")


# ---------------------------------------------------------------------------- the references


def test_every_flag_has_help_text() -> None:
    missing = [
        f"{path} {p.opts[0]}"
        for path, cmd, _ in reference.commands(hidden=True)
        for p in reference.options(cmd)
        if not (p.help or "").strip()
    ]
    assert not missing, f"flags without help text (add help= where they are declared): {missing}"


def test_every_yaml_key_has_a_description() -> None:
    docs = reference.field_docs()
    missing = [k for k in (*YAML_KEYS, *FLAG_ONLY) if not docs.get(k)]
    assert not missing, (
        f"JobOptions fields without a docstring (mncloud/options.py; the mncloud.yaml reference "
        f"reads it): {missing}"
    )


def test_the_cli_reference_lists_every_command_and_option(site: Path) -> None:
    page = (site / "reference" / "cli.html").read_text()
    walked = list(reference.commands())
    assert {"mncloud up", "mncloud ckpt ls", "mncloud chaos preempt"} <= {p for p, _, _ in walked}
    missing = [p for p, _, _ in walked if f'id="{reference._anchor(p)}"' not in page]
    missing += [
        f"{path} {p.opts[0]}"
        for path, cmd, _ in walked
        for p in reference.options(cmd)
        if f'id="{reference._anchor(path, p.opts[0])}"' not in page
    ]
    assert not missing, f"not in the CLI reference: {missing}"
    assert 'id="mncloud-control"' not in page  # hidden: internal


def test_the_configuration_reference_lists_every_key(site: Path) -> None:
    page = (site / "reference" / "configuration.html").read_text()
    missing = [k for k in YAML_KEYS if f'id="key-{k.replace("_", "-")}"' not in page]
    assert not missing, f"mncloud.yaml keys not in the reference: {missing}"
    assert "Accelerators per node" in page  # a docstring, not only the names


def test_the_api_reference_lists_every_public_name(site: Path) -> None:
    page = (site / "reference" / "api.html").read_text()
    missing = [
        f"{package}.{name}"
        for package in ("mncloud.train", "mncloud.storage")
        for name in reference.public_names(package)
        if f'id="{package}.{name}"' not in page
    ]
    assert len(reference.public_names("mncloud.train")) > 10
    assert not missing, f"public names not in the API reference: {missing}"


def test_the_api_page_opens_with_examples_of_every_public_class(site: Path) -> None:
    """The page starts with examples, one naming each public class, and shows what a script
    imports, not the packages' module listings (their `__init__` docstrings)."""
    source = (ROOT / "docs" / "reference" / "api.md").read_text()
    head = source.split("## `mncloud.train`", 1)[0]
    assert "## Examples" in head and head.index("## Examples") < head.index("```")
    classes = [
        n for package in ("mncloud.train", "mncloud.storage")
        for n in reference.public_names(package) if n[0].isupper()
    ]  # fmt: skip
    code = "".join(re.findall(r"```python\n(.*?)```", head, re.S))
    unshown = [n for n in classes if f"`{n}`" not in head or not re.search(rf"\b{n}\b", code)]
    assert not unshown, f"public classes without an example on the API page: {unshown}"
    page = (site / "reference" / "api.html").read_text()
    listings = ("the asynchronous save pipeline behind", "THE parser of s3://")
    assert not any(line in page for line in listings)  # the packages' module listings


# ------------------------------------------------------------------------ the CLI's examples


def test_every_command_has_an_example(site: Path) -> None:
    """scripts/cli_examples.yaml has one example per command, starting with the command,
    shown under it in the CLI reference."""
    examples = reference.examples()
    paths = [p for p, _, _ in reference.commands()]
    assert sorted(examples) == sorted(paths), (
        f"commands without an example: {sorted(set(paths) - set(examples))}; "
        f"examples of no command: {sorted(set(examples) - set(paths))}"
    )
    page = html.unescape(re.sub(r"<[^>]+>", "", (site / "reference" / "cli.html").read_text()))
    for path, example in examples.items():
        assert example["run"].startswith(f"{path} ") or example["run"] == path, path
        assert example["run"] in page, f"{path}: example not shown"


def test_cli_examples_run(project: Path) -> None:
    """Each example without `not-run` runs (exit 0) in the docs project; each `not-run` says
    why and names the test that runs the command instead."""
    ran = 0
    for path, example in reference.examples().items():
        reason = example.get("not-run")
        if reason is not None:
            assert re.search(r"tests/test_\w+\.py", reason), f"{path}: not-run names no test"
            continue
        if _needs_catalog_text(example["run"]) and CATALOG is None:
            continue
        code, out = docblocks.run_line(example["run"], project, {})
        assert code == 0, f"scripts/cli_examples.yaml: {path}: `{example['run']}`:\n{out[-2000:]}"
        ran += 1
    assert ran >= 8


# ------------------------------------------------------------- flags and keys the pages name


def _script_flags() -> set[str]:
    """The flags of the example scripts (`-- --steps 600`) and the benchmarks the pages quote,
    read from their argparse calls."""
    scripts = [*(ROOT / "examples").glob("*.py"), *(ROOT / "bench").glob("*.py")]
    text = " ".join(p.read_text() for p in scripts)
    return set(re.findall(r"add_argument\(\s*\"(--[a-z0-9_-]+)\"", text))


#: Flags of other tools the pages quote (torchrun, accelerate, deepspeed, pip, pytest, sky).
FOREIGN = {
    "--multi_gpu", "--num_machines", "--machine_rank", "--main_process_ip",
    "--main_process_port", "--num_processes", "--hostfile", "--no_ssh", "--node_rank",
    "--master_addr", "--master_port", "--local_rank", "--update-lock", "--durations",
    "--lr", "--split", "--batch-size", "--before",
}  # fmt: skip


def stale_names() -> Iterator[str]:
    """`page:line: name` for each flag or `mncloud.yaml` key a page names that does not exist."""
    cmds = {path: reference.option_names(cmd) for path, cmd, _ in reference.commands(hidden=True)}
    every = set().union(*cmds.values()) | _script_flags() | FOREIGN | {"--version"}
    every |= {"--install-completion", "--show-completion"}

    def check(where: str, words: list[str]) -> Iterator[str]:
        path = "mncloud"
        for w in words[1:]:
            if f"{path} {w}" in cmds:
                path = f"{path} {w}"
            elif not w.startswith("-"):
                break
        if path == "mncloud" and len(words) > 1 and not words[1].startswith("-"):
            if re.fullmatch(r"[a-z]+", words[1]) and words[1] not in {"…"}:
                yield f"{where}: mncloud {words[1]}: no such command"
            return
        known = cmds.get(path, every)
        for flag in docblocks.flag_words(words):
            if flag not in known:
                yield f"{where}: {flag}: no such option of `{path}`"

    for path, example in reference.examples().items():
        for words in docblocks.commands_in(example["run"]):
            yield from check(f"scripts/cli_examples.yaml: {path}", words)
    for page in docblocks.pages():
        for block in docblocks.blocks(page):
            if block.lang in ("bash", "console", "text"):
                for n, line in docblocks.shell_lines(block):
                    for words in docblocks.commands_in(line):
                        yield from check(f"{page.relative_to(docblocks.ROOT)}:{n}", words)
            if block.is_code and block.lang == "yaml":
                yield from _stale_keys(block, yaml.safe_load(block.text) or {})
        for n, code in docblocks.named_in_prose(page):
            where = f"{page.relative_to(docblocks.ROOT)}:{n}"
            if code.startswith("mncloud "):
                for words in docblocks.commands_in(code):
                    yield from check(where, words)
            elif code.startswith("--"):
                flag = next(docblocks.flag_words([code.split()[0]]), None)
                if flag and flag not in every:
                    yield f"{where}: {flag}: no such option of any command"
            elif (
                (m := re.fullmatch(r"([a-z_]+):(?: .*)?", code))
                and _mentions_config(page, n)
                and m.group(1) not in YAML_KEYS
            ):
                yield f"{where}: {m.group(1)}: no such mncloud.yaml key"


def _mentions_config(page: Path, n: int) -> bool:
    lines = page.read_text().splitlines()
    return any("mncloud.yaml" in line for line in lines[max(0, n - 2) : n + 1])


def _stale_keys(block: Block, data: dict[str, Any]) -> Iterator[str]:
    for key in data:
        if key not in YAML_KEYS:
            yield f"{block.where}: {key}: no such mncloud.yaml key"


def test_pages_name_only_flags_and_keys_that_exist() -> None:
    stale = list(stale_names())
    assert not stale, "pages name options that do not exist:\n" + "\n".join(stale)


def test_a_stale_flag_is_named_with_its_page_and_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    page = tmp_path / "stale.md"
    page.write_text(
        "Run it:\n\n```bash\nmncloud up train.py --gpus H100:8 --colour blue -- --steps 3\n```\n\n"
        "Or set `--nodez 4`, or `max_hourli: 3` in mncloud.yaml.\n"
    )
    monkeypatch.setattr(docblocks, "pages", lambda: [page])
    monkeypatch.setattr(docblocks, "ROOT", tmp_path)
    stale = list(stale_names())
    assert stale == [
        f"{page.relative_to(tmp_path)}:4: --colour: no such option of `mncloud up`",
        f"{page.relative_to(tmp_path)}:7: --nodez: no such option of any command",
        f"{page.relative_to(tmp_path)}:7: max_hourli: no such mncloud.yaml key",
    ]


# ------------------------------------------------------------------------- the examples page


def test_the_examples_page_lists_every_example() -> None:
    """docs/examples.md has a row and a section for each script in examples/, the section's
    command running that script."""
    page = ROOT / "docs" / "examples.md"
    text = page.read_text()
    scripts = sorted(f"examples/{p.name}" for p in (ROOT / "examples").glob("*.py"))
    assert scripts
    for script in scripts:
        assert f"| `{script}` |" in text, f"{script}: no row in docs/examples.md"
        section = text.split(f"## `{script}`\n", 1)
        assert len(section) == 2, f"{script}: no section in docs/examples.md"
        body = section[1].split("\n## ", 1)[0]
        commands = [
            line for b in docblocks.blocks(page) if b.text in body
            for _, line in docblocks.shell_lines(b)
        ]  # fmt: skip
        assert any(f"mncloud up {script} " in c for c in commands), f"{script}: no command"


# ------------------------------------------------------------------------- blocks that run


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A project as a reader has one: `train.py` (the DDP example), `examples/`, a fresh
    home, no cloud enabled (SkyPilot's state empty), the catalog snapshot when there is one."""
    proj = tmp_path / "proj"
    shutil.copytree(ROOT / "examples", proj / "examples")
    shutil.copy(ROOT / "examples" / "train_ddp.py", proj / "train.py")
    (proj / "pyproject.toml").write_text("[project]\nname = 'proj'\n")
    monkeypatch.setenv("MNCLOUD_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("SKYPILOT_API_SERVER_ENDPOINT", raising=False)
    monkeypatch.chdir(proj)
    if CATALOG is not None:
        (tmp_path / "shared").symlink_to(CATALOG.resolve().parent)
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("COLUMNS", "100")
    monkeypatch.setenv("NO_COLOR", "1")
    return proj


def _needs_catalog_text(text: str) -> bool:
    return bool(re.search(r"mncloud (plan|gpus|up|render|doctor|replay)\b|\.\./shared/", text))


def _needs_catalog(block: Block) -> bool:
    return _needs_catalog_text(block.text)


def run_block(block: Block, proj: Path) -> None:
    """Run one block in the project; fail naming its page and line."""
    env: dict[str, str] = {}
    if block.lang == "python":
        done = subprocess.run(
            [sys.executable, "-c", block.text], cwd=proj, capture_output=True, text=True,
            timeout=300, check=False,
        )  # fmt: skip
        assert done.returncode == 0, f"{block.where}: {done.stderr[-2000:]}"
    elif block.lang == "yaml":
        from mncloud import request

        (proj / "mncloud.yaml").write_text(block.text)
        try:
            request.project_options(proj)
        finally:
            (proj / "mncloud.yaml").unlink()
    elif block.lang == "bash":
        for n, line in docblocks.shell_lines(block):
            if m := re.fullmatch(r"([A-Z_]+)=(\S+)", line.strip()):
                env[m.group(1)] = m.group(2)
                continue
            code, out = docblocks.run_line(line.strip(), proj, env)
            assert code == 0, (
                f"{block.page.relative_to(ROOT)}:{n}: `{line.strip()}`:\n{out[-2000:]}"
            )
    else:  # console: each `$ command` and the output the page shows after it
        for command, expected in docblocks.console_steps(block):
            code, got = docblocks.run_line(command, proj, env)
            got = got.replace(str(proj.parent), "/work")
            assert docblocks.shown(expected, got.strip()), (
                f"{block.where}: `{command}` printed\n{got}\nthe page shows\n{expected}"
            )
            assert code == docblocks.exit_shown(expected), (
                f"{block.where}: `{command}` exited {code}; the page says "
                f"{docblocks.exit_shown(expected)}"
            )


def test_code_blocks_run(project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Every code block runs here, or the line before it says why it cannot."""
    run, not_run, unmarked = 0, 0, []
    skipped = []
    for block in docblocks.all_blocks():
        if block.not_run is not None:
            not_run += 1
            continue
        if not block.is_code:
            continue
        if _needs_catalog(block) and CATALOG is None:
            skipped.append(block.where)
            continue
        try:
            run_block(block, project)
        except AssertionError:
            raise
        except Exception as err:  # a block's own failure, named by its page and line
            unmarked.append(f"{block.where}: {type(err).__name__}: {err}")
            continue
        run += 1
    with capsys.disabled():
        print(f"\ndocs code blocks: {run} run, {not_run} marked not-run, {len(skipped)} skipped "
              f"(no catalog snapshot: ../shared/catalogs)")  # fmt: skip
    assert not unmarked, "\n".join(unmarked)


@pytest.mark.catalog
def test_shown_plan_output_is_current() -> None:
    """The plan table the planning guide shows is what `scripts/docs_outputs.py` makes now."""
    if CATALOG is None:
        pytest.skip("no catalog snapshot (../shared/catalogs)")
    outputs = _load("docs_outputs")
    now = outputs.plan_steps()
    shown = outputs.shown("plan-steps")
    assert shown, "no page shows the plan-steps output"
    for page, text in shown:
        assert text == now, f"{page}: run `python scripts/docs_outputs.py plan-steps`"


# ----------------------------------------------------------------------------- the browser


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        """(no access log on the test's output)"""


@contextmanager
def _served(site: Path) -> Iterator[str]:
    """The built site over HTTP on a free loopback port, as `mkdocs serve` would show it."""
    handler = functools.partial(_Quiet, directory=str(site))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


def test_the_site_opens_in_a_browser(site: Path) -> None:
    chromium = shutil.which("chromium")
    if chromium is None:
        pytest.skip("no chromium (apt-get install chromium; scripts/setup.sh tries)")
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed")
    expect = sync_api.expect
    fetched: list[str] = []
    with _served(site) as base, sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium)
        page = browser.new_page()
        page.on("request", lambda r: fetched.append(r.url))
        for path, title in (
            ("index.html", "mncloud"),
            ("getting-started/first-cloud-run.html", "Your first cloud run"),
        ):
            page.goto(f"{base}/{path}")
            expect(page).to_have_title(re.compile(title))
            expect(page.locator("nav.md-nav--primary").first).to_contain_text("Guides")
            expect(page.locator("pre code").first).to_be_visible()
            expect(page.locator("h1").first).to_contain_text(title.split(":")[0])
        browser.close()
    elsewhere = [u for u in fetched if not u.startswith((base, "data:", "blob:"))]
    assert not elsewhere, f"the site fetched from elsewhere: {elsewhere}"


#: The end of a code block's first line, scrolled to the end, and the copy button's box.
_LINE_END = """el => {
  el.scrollLeft = el.scrollWidth;
  const walker = document.createTreeWalker(el, NodeFilter.SHOW_TEXT);
  let node = null, at = -1, prev = null, n;
  while ((n = walker.nextNode())) {
    const i = n.textContent.indexOf('\\n');
    if (i > 0) { node = n; at = i; break; }
    if (i === 0) { node = prev; at = prev.textContent.length; break; }
    if (n.textContent.length) prev = n;
  }
  const range = document.createRange();
  range.setStart(node, at - 1);
  range.setEnd(node, at);
  const end = range.getBoundingClientRect();
  const button = el.closest('pre').querySelector('[data-md-type=copy]').getBoundingClientRect();
  return {scrolls: el.scrollWidth > el.clientWidth, overflow: getComputedStyle(el).overflowX,
          end: [end.left, end.right, end.top, end.bottom],
          button: [button.left, button.right, button.top, button.bottom]};
}"""


def test_the_site_search_finds_a_word_and_long_commands_scroll_clear(site: Path) -> None:
    """Over HTTP, as a reader opens it: the search box finds a word's pages (the index and its
    worker are the site's own), and a command longer than its code block scrolls to its last
    character, which the copy button does not cover."""
    chromium = shutil.which("chromium")
    if chromium is None:
        pytest.skip("no chromium (apt-get install chromium; scripts/setup.sh tries)")
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed")
    expect = sync_api.expect
    with _served(site) as base, sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium)
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        page.goto(f"{base}/index.html")
        page.locator("input.md-search__input").click()
        page.keyboard.type("lighthouse", delay=30)  # keystrokes: the search listens for them
        results = page.locator(".md-search-result__item")
        expect(results.first).to_be_visible(timeout=20_000)
        expect(page.locator(".md-search-result__meta")).to_contain_text("matching")
        page.goto(f"{base}/getting-started/first-cloud-run.html")
        code = page.locator("pre code").filter(has_text="--name first --dryrun").first
        code.scroll_into_view_if_needed()
        expect(code.locator("xpath=..").locator("[data-md-type=copy]")).to_be_attached()
        box = code.evaluate(_LINE_END)
        browser.close()
    assert box["scrolls"] and box["overflow"] in ("auto", "scroll"), box
    (left, right, top, bottom), (b_left, b_right, b_top, b_bottom) = box["end"], box["button"]
    covered = left < b_right and right > b_left and top < b_bottom and bottom > b_top
    assert not covered, f"the command's last character lies under the copy button: {box}"


def test_docs_script_names_the_install_command_without_mkdocs(tmp_path: Path) -> None:
    """`scripts/docs.sh serve` with a Python that lacks mkdocs: one line saying what to run."""
    bare = tmp_path / "bare"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(bare)], check=True)
    done = subprocess.run(
        ["bash", str(ROOT / "scripts" / "docs.sh"), "serve"],
        env={**os.environ, "DOCS_PYTHON": str(bare / "bin" / "python")},
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 2
    assert "bash scripts/setup.sh" in done.stderr and "Traceback" not in done.stderr
