"""`mncloud ui` (mncloud/ui/): the real app over the records of a real local run.

One 2-node × 2-process local run, preempted once, serves every test here: in-process through
FastAPI's TestClient, and in a real browser (Playwright driving Debian's chromium), skipped with
the reason where either is missing. Host, token and port checks are unit tests.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from mncloud import layout
from mncloud.cli import app as cli_app
from mncloud.ui import serve as ui_serve
from mncloud.ui import views
from mncloud.ui.app import COOKIE, create_app
from tests.test_local import EXAMPLE, cli, state_of, steps_since, up, wait_final, wait_until

fastapi_testclient = pytest.importorskip("fastapi.testclient", reason="needs the [ui] extra")
TestClient = fastapi_testclient.TestClient

REPO = Path(__file__).resolve().parents[1]
RUN = "ui-demo"
SCRIPT_LINE = "<script>alert(1)</script> from the log"
HTML_NAME = "<b>x</b>"


@pytest.fixture(scope="module")
def demo_home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A home holding one finished 2×2 local run preempted once, its log with a script tag,
    and a run folder whose state.json is torn."""
    from mncloud.backends.base import RunState
    from mncloud.storage import CheckpointStore

    home = tmp_path_factory.mktemp("ui-home")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MNCLOUD_HOME", str(home))
        args = ["--steps", "200", "--ckpt-interval", "25", "--log-every", "100"]
        up(RUN, EXAMPLE, "--nodes", "2", "--gpus", "cpu:2", "--recovery-delay", "0.5s",
           script_args=args)  # fmt: skip
        store = CheckpointStore(state_of(RUN).ckpt_uri)

        def checkpoint_behind_training() -> bool:
            good, _ = store.candidates()
            return bool(good) and max(steps_since(RUN, 0), default=0) > good[0] + 3

        wait_until(checkpoint_behind_training, 180, "a checkpoint, and steps past it")
        cli("chaos", "preempt", RUN, "--node", "1")
        assert wait_final(RUN).state is RunState.SUCCEEDED
        from mncloud.records.store import load_current

        wait_until(lambda: load_current(RUN).finished, 30, "the record's finish")
        with (layout.run_dir(RUN) / "run.log").open("a") as log:
            log.write(f"{SCRIPT_LINE}\n")
        torn = layout.run_dir("torn")
        torn.mkdir(parents=True)
        (torn / "backend.json").write_text(json.dumps({"backend": "local"}))
        (torn / "state.json").write_text("{")
        yield home


@pytest.fixture
def client(demo_home: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setenv("MNCLOUD_HOME", str(demo_home))
    return TestClient(create_app(), raise_server_exceptions=False)


def _parts(html: str) -> tuple[dict[str, float], float]:
    found = re.findall(r'data-part="(\w+)" data-value="([^"]+)"', html)
    values = {name: float(value) for name, value in found}
    total = float(re.search(r'id="breakdown" data-total="([^"]+)"', html)[1])  # type: ignore[index]
    return values, total


@pytest.mark.slow
def test_the_runs_table_lists_the_run_and_an_unreadable_one(client: Any) -> None:
    page = client.get("/")
    assert page.status_code == 200
    row = page.text.split(f'href="/runs/{RUN}"')[1].split("</tr>")[0]
    assert "SUCCEEDED" in row and "1 restart, 1 preemption" in row and "%" in row
    torn = page.text.split('href="/runs/torn"')[1].split("</tr>")[0]
    assert "UNREADABLE" in torn and "state.json" in torn  # the others still render
    assert client.get("/runs/torn").status_code == 200  # its page shows the error


@pytest.mark.slow
def test_a_run_page_draws_the_timeline_and_the_breakdown(client: Any) -> None:
    from mncloud.operate import run_goodput
    from mncloud.records.store import load_current

    page = client.get(f"/runs/{RUN}")
    assert page.status_code == 200
    timeline = page.text.split('id="timeline"')[1].split("</svg>")[0]
    assert timeline.count('class="launch"') == 2
    assert timeline.count('class="mark preemption"') == 1
    assert 'class="tick complete"' in timeline
    values, total = _parts(page.text)
    ledger = run_goodput(load_current(RUN))
    assert sum(values.values()) == pytest.approx(total) == pytest.approx(ledger.total_node_seconds)
    assert values["useful"] == pytest.approx(ledger.parts["useful"].node_seconds)
    # Preempted once: the first launch's start-up and the relaunch's recovery, apart.
    assert values["startup"] > 0 and values["recovery"] > 0 and ">start-up</text>" in page.text
    assert "commit" in page.text and "<h2>Checkpoints</h2>" in page.text
    # The local run's script reports its loss through the same telemetry segments as a cloud
    # run's: the page draws it, one line per launch of node 0's lowest rank or more.
    curves = page.text.split('id="curves"')[1]
    loss = curves.split('data-kind="metric-loss"')[1].split("</svg>")[0]
    assert loss.count('<polyline class="launch') >= 1
    assert 'data-kind="step-time"' in curves


@pytest.mark.slow
def test_user_strings_are_escaped(client: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    logs = client.get(f"/runs/{RUN}/logs", params={"tail": 5}).json()
    assert SCRIPT_LINE in logs["lines"]  # JSON; the page's script sets it as textContent
    monkeypatch.setattr(
        views, "run_rows", lambda: [views.RunRow(name=HTML_NAME, state="RUNNING", detail=HTML_NAME)]
    )
    page = client.get("/").text
    assert HTML_NAME not in page and "&lt;b&gt;x&lt;/b&gt;" in page
    missing = client.get("/runs/<script>alert(1)</script>")
    assert missing.status_code == 404 and "<script>alert" not in missing.text
    assert "script-src 'nonce-" in missing.headers["content-security-policy"]


@pytest.mark.slow
def test_unknown_runs_are_a_404_page_and_writes_are_refused(client: Any) -> None:
    page = client.get("/runs/no-such-run")
    assert page.status_code == 404 and "no run named" in page.text and "Traceback" not in page.text
    assert client.get("/runs/no-such-run/logs").status_code == 404
    assert client.post("/").status_code == 405
    assert client.get(f"/runs/{RUN}/logs", params={"node": 9}).json()["error"]


def test_a_non_loopback_host_needs_a_token() -> None:
    assert ui_serve.binding("127.0.0.1", 8765, None).token is None
    bound = ui_serve.binding("0.0.0.0", 8765, None)
    assert bound.generated and bound.token and len(bound.token) >= 16
    assert ui_serve.binding("::", 8765, "t" * 20).token == "t" * 20
    for host, port, token in [("example.com", 80, None), ("0.0.0.0", 0, None),
                              ("0.0.0.0", 80, "short")]:  # fmt: skip
        with pytest.raises(ui_serve.UiError):
            ui_serve.binding(host, port, token)
    guarded = TestClient(create_app(token="s3cret-token-0123456789"))
    assert guarded.get("/").status_code == 401
    assert guarded.get("/", params={"token": "wrong"}).status_code == 401
    opened = guarded.get("/", params={"token": "s3cret-token-0123456789"})
    assert opened.status_code == 200 and COOKIE in opened.headers["set-cookie"]
    assert guarded.get("/").status_code == 200  # the cookie


def test_the_command_checks_and_refuses_a_port_in_use() -> None:
    runner = CliRunner()
    done = runner.invoke(cli_app, ["ui", "--host", "0.0.0.0", "--check"])
    assert done.exit_code == 0 and "?token=" in done.output
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        done = runner.invoke(cli_app, ["ui", "--port", str(port)])
    assert done.exit_code == 2
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and f"port {port}" in lines[0] and "try --port" in lines[0]


# --------------------------------------------------------------------------- a real browser


def _browser() -> tuple[Any, str]:
    chromium = shutil.which("chromium")
    if chromium is None:
        pytest.skip("no chromium (apt-get install chromium; scripts/setup.sh tries)")
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed")
    return sync_api, chromium


@pytest.fixture
def served(demo_home: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """The app under uvicorn in a thread, on a free loopback port."""
    import uvicorn

    monkeypatch.setenv("MNCLOUD_HOME", str(demo_home))
    port = ui_serve.free_port()
    bound = ui_serve.Binding("127.0.0.1", port, None)
    app = create_app(allowed_hosts=ui_serve.allowed_hosts(bound))
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", ws="none")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    wait_until(lambda: server.started, 20, "uvicorn to start")
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(10)


@pytest.mark.slow
def test_in_a_real_browser(served: str, demo_home: Path) -> None:
    sync_api, chromium = _browser()
    expect = sync_api.expect
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium)
        page = browser.new_page(viewport={"width": 1000, "height": 1000})
        dialogs: list[str] = []
        page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
        page.goto(served + "/")
        expect(page.locator("#runs")).to_contain_text(RUN)
        expect(page.locator("#runs")).to_contain_text("UNREADABLE")
        page.click(f"text={RUN}")
        expect(page.locator("#run-name")).to_have_text(RUN)
        expect(page.locator("#timeline rect.launch")).to_have_count(2)
        expect(page.locator("#timeline g.mark.preemption")).to_have_count(1)
        expect(page.locator("#log")).to_contain_text(SCRIPT_LINE)  # as text, not run
        line = f"written at {time.time():.3f} <i>by the test</i>"
        with (layout.run_dir(RUN) / "run.log").open("a") as log:
            log.write(line + "\n")
        expect(page.locator("#log")).to_contain_text(line, timeout=5000)  # polled
        assert not dialogs
        # README's picture is retaken only when asked (MNCLOUD_UI_SCREENSHOT=docs/ui-run.png):
        # a test run never rewrites a tracked file.
        shot = os.environ.get("MNCLOUD_UI_SCREENSHOT") or str(demo_home / "ui-run.png")
        page.screenshot(path=shot)
        assert Path(shot).stat().st_size > 0
        browser.close()
