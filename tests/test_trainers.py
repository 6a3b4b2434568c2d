"""The trainers people already use, unchanged, through mncloud (`mncloud.train.sitehook`,
docs/guides/trainers.md): the site hook (the Trainer's `cpu:0` map_location, the callbacks
added), the callbacks' steps and their one-line warning, the newest `--ckpt-dir` checkpoint by
name, and, for the Hugging Face Trainer and Lightning, a real 2-node local run preempted once
that ends on the uninterrupted run's weights."""

from __future__ import annotations

import hashlib
import io
import logging
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any, ClassVar

import pytest

from mncloud import constants, layout
from mncloud.storage.folders import COMMITS
from mncloud.storage.frameworkdirs import Newest, entry_step, newest

REPO = Path(__file__).resolve().parents[1]


def _site_hook(tmp_path: Path) -> Path:
    from mncloud.backends.local.nodes import site_hook

    return site_hook(tmp_path)


# --------------------------------------------------------------------------- fast


@pytest.mark.parametrize(
    ("name", "step"),
    [
        ("checkpoint-40", 40), ("step-7", 7), ("epoch=3-step=32.ckpt", 32),
        ("epoch=3-step=32-v1.ckpt", 32), ("step=5.ckpt", 5), ("tmp-checkpoint-40", None),
        ("last.ckpt", None), ("final", None), ("checkpoint-40.partial", None),
    ],
)  # fmt: skip
def test_a_checkpoint_entry_is_named_by_its_step(name: str, step: int | None) -> None:
    assert entry_step(name) == step


def test_the_newest_entry_is_the_highest_step_not_the_last_listed() -> None:
    keys = ["checkpoint-100/model.safetensors", "checkpoint-20/optimizer.pt", "final/x",
            "tmp-checkpoint-120/model.safetensors", "runs/log.txt"]  # fmt: skip
    assert newest(keys) == Newest("checkpoint-100", 100)
    assert newest(["last.ckpt", "epoch=1-step=8.ckpt", "epoch=0-step=4.ckpt"]) == Newest(
        "epoch=1-step=8.ckpt", 8
    )
    assert newest(["snapshot.pt"]) is None


def test_the_site_hook_lets_torch_load_onto_cpu_0(tmp_path: Path) -> None:
    """The Trainer's optimizer load on a CPU-only multi-process run: refused by torch alone,
    restored with the local backend's site hook on the path."""
    import torch

    path = tmp_path / "opt.pt"
    torch.save({"exp_avg": torch.ones(3)}, path)
    with pytest.raises(RuntimeError, match="cpu:0"):
        torch.load(path, map_location="cpu:0")
    code = (
        "import torch; s = torch.load(__import__('sys').argv[1], map_location='cpu:0'); "
        "print(s['exp_avg'].sum().item())"
    )
    env = {**os.environ, "PYTHONPATH": str(_site_hook(tmp_path))}
    done = subprocess.run(
        [sys.executable, "-c", code, str(path)], env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "3.0"


def test_the_site_hook_runs_the_sitecustomize_it_shadows(tmp_path: Path) -> None:
    other = tmp_path / "other"
    other.mkdir()
    (other / "sitecustomize.py").write_text("import builtins\nbuiltins.SHADOWED = 1\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(_site_hook(tmp_path)), str(other)])}
    code = "import sys, builtins; print(builtins.SHADOWED, type(sys.meta_path[0]).__name__)"
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert done.stdout.split() == ["1", "_AfterImport"], done.stderr


def test_the_site_hook_gives_a_lightning_trainer_mncloud_s_callback(tmp_path: Path) -> None:
    """Through the real import of `lightning` (its package is still initializing when its
    trainer module ends: the hook waits for `lightning.pytorch`)."""
    pytest.importorskip("lightning")
    code = (
        "import lightning as L; t = L.Trainer(logger=False, enable_progress_bar=False); "
        "print(*[type(c).__module__ for c in t.callbacks])"
    )
    env = {**os.environ, "PYTHONPATH": str(_site_hook(tmp_path))}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert "site hook skipped" not in done.stderr, done.stderr
    assert "mncloud.train.pl" in done.stdout.split(), done.stdout + done.stderr


def test_local_nodes_get_the_site_hook_first_on_their_path(tmp_path: Path) -> None:
    from mncloud.backends.local.nodes import node_env
    from mncloud.backends.local.state import LocalLaunch

    launch = LocalLaunch(
        name="r", token="t", task_id="task", workdir=str(tmp_path), run="true",
        num_nodes=1, procs_per_node=1, master_port=29500, ckpt_uri="file:///tmp/x",
    )  # fmt: skip
    env = node_env(launch, tmp_path, 0, metadata_url="http://127.0.0.1:1/node/0", setup=False)
    first = Path(env["PYTHONPATH"].split(os.pathsep)[0])
    assert first == layout.site_hook_dir(tmp_path)
    assert (first / "sitecustomize.py").read_bytes() == layout.site_hook_source().read_bytes()


class _Reports:
    """`report` and `event` as the callbacks call them, recorded."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, module: Any) -> None:
        self.steps: list[tuple[int, dict[str, Any]]] = []
        self.events: list[tuple[str, dict[str, Any]]] = []
        monkeypatch.setattr(module, "report", lambda s, **m: self.steps.append((s, m)))
        monkeypatch.setattr(module, "event", lambda n, **f: self.events.append((n, f)))


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.getMessage().startswith("mncloud:")]


@pytest.fixture
def hf_trainer_module() -> Any:
    transformers = pytest.importorskip("transformers")
    import transformers.trainer as module

    from mncloud.train import sitehook

    sitehook.imported("transformers.trainer", module)  # what the site hook does
    return transformers


def test_the_hf_callback_reports_steps_and_warns_once_of_output_dir_outside(
    hf_trainer_module: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:  # fmt: skip
    import torch

    from mncloud.train import hf

    transformers = hf_trainer_module
    reports = _Reports(monkeypatch, hf)
    monkeypatch.setenv(constants.CKPT_DIR_ENV, str(tmp_path / "ckpt"))
    config = transformers.GPT2Config(vocab_size=16, n_positions=8, n_embd=8, n_layer=1, n_head=1)
    ids = torch.arange(8).repeat(4, 1)
    data = [{"input_ids": row, "labels": row} for row in ids]
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path / "elsewhere"), max_steps=3, save_steps=1, logging_steps=1,
        per_device_train_batch_size=2, use_cpu=True, report_to=[], save_only_model=True,
    )  # fmt: skip
    mine = hf.MncloudCallback()
    trainer = transformers.Trainer(
        model=transformers.GPT2LMHeadModel(config), args=args, train_dataset=data,
        callbacks=[mine],
    )  # fmt: skip
    added = [c for c in trainer.callback_handler.callbacks if isinstance(c, hf.MncloudCallback)]
    assert added == [mine]  # the script's own: not added twice
    with caplog.at_level(logging.WARNING):
        trainer.train()
    assert [s for s, _ in reports.steps if _ == {}] == [1, 2, 3]
    assert all("loss" in m for s, m in reports.steps if m), reports.steps
    assert [n for n, _ in reports.events] == ["start", "done"]
    assert reports.events[0][1]["resumed_from"] == 0
    warned = _warnings(caplog)
    assert len(warned) == 1 and str(tmp_path / "elsewhere") in warned[0], warned
    assert "$MNCLOUD_CKPT_DIR" in warned[0] and "\n" not in warned[0]
    plain = transformers.Trainer(model=transformers.GPT2LMHeadModel(config), args=args)
    assert any(isinstance(c, hf.MncloudCallback) for c in plain.callback_handler.callbacks)


@pytest.fixture
def lightning_module() -> Any:
    lightning = pytest.importorskip("lightning")
    import lightning.pytorch as module

    from mncloud.train import sitehook

    sitehook.imported("lightning.pytorch", module)
    return lightning


def test_the_lightning_callback_reports_steps_and_warns_inside_ckpt_dir_never(
    lightning_module: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:  # fmt: skip
    from lightning.pytorch.callbacks import ModelCheckpoint

    from mncloud.train import pl

    sys.path.insert(0, str(REPO / "examples"))
    try:
        import lightning_train as example
    finally:
        sys.path.remove(str(REPO / "examples"))
    reports = _Reports(monkeypatch, pl)
    L = lightning_module

    def fit(dirpath: Path) -> None:
        trainer = L.Trainer(
            max_steps=2, callbacks=[ModelCheckpoint(dirpath=dirpath, every_n_train_steps=1)],
            logger=False, enable_progress_bar=False, enable_model_summary=False,
            default_root_dir=tmp_path,
        )  # fmt: skip
        assert sum(isinstance(c, pl.MncloudCallback) for c in trainer.callbacks) == 1
        loader = example.DataLoader(example.data(64), batch_size=16)
        trainer.fit(example.Regressor(), loader)

    monkeypatch.setenv(constants.CKPT_DIR_ENV, str(tmp_path / "ckpt"))
    with caplog.at_level(logging.WARNING):
        fit(tmp_path / "ckpt" / "sub")
    assert [s for s, _ in reports.steps] == [1, 2]
    assert all("loss" in m for _, m in reports.steps)
    assert [n for n, _ in reports.events] == ["start", "done"]
    assert _warnings(caplog) == []
    with caplog.at_level(logging.WARNING):
        fit(tmp_path / "elsewhere")
    warned = _warnings(caplog)
    assert len(warned) == 1 and str(tmp_path / "elsewhere") in warned[0], warned


def test_a_ckpt_dir_summary_names_the_newest_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from mncloud.cli import follow
    from mncloud.records.store import load_current
    from mncloud.storage import open_bucket
    from mncloud.storage.foldersync import NodeSync

    uri = (tmp_path / "bucket" / "run").as_uri()
    bucket, prefix = open_bucket(layout.ckpt_dir_uri(uri), retry_seconds=5)
    node = NodeSync(tmp_path / "node", tmp_path / "node.up", bucket, prefix, 0, 1, set)
    for name in ("checkpoint-20", "checkpoint-40", "tmp-checkpoint-60"):
        (node.path / name).mkdir(parents=True)
        (node.path / name / "model.safetensors").write_bytes(b"w")
    node.sync(), node.sync()  # committed whole: files, then the node's marker
    torn = tmp_path / "bucket" / "run" / layout.CKPT_DIR_NAME / "checkpoint-60"
    torn.mkdir()  # a folder a preempted save left in the bucket: files, no marker
    (torn / "model.safetensors").write_bytes(b"w")

    class Record:
        spec: ClassVar[dict[str, Any]] = {"ckpt_dir": "/ckpt"}
        ckpt_uri = None

    monkeypatch.setattr("mncloud.records.store.load_current", lambda _name: Record())
    assert load_current is not None
    line = follow.ckpt_dir_line("run", uri)
    assert line == "newest checkpoint in --ckpt-dir /ckpt: checkpoint-40 (step 40)"
    Record.spec = {}
    assert follow.ckpt_dir_line("run", uri) is None


def _node(tmp_path: Path, uri: str) -> Any:
    from mncloud.storage import open_bucket
    from mncloud.storage.foldersync import NodeSync

    bucket, prefix = open_bucket(layout.ckpt_dir_uri(uri), retry_seconds=5)
    node = NodeSync(tmp_path / "node", tmp_path / "node.up", bucket, prefix, 0, 1, set)
    node.restore()
    return node


def test_a_ckpt_dir_runs_final_weights_are_its_newest_units_verified(tmp_path: Path) -> None:
    """What the summary's reference comparison reads without a final.json: the newest
    committed unit's tensors by name (a Trainer's safetensors, Lightning's `state_dict`),
    not its file's bytes (Lightning's holds the node's paths); a file that fails its record
    gives no figure."""
    import torch
    from safetensors.torch import save as save_safetensors

    from mncloud.storage.final import ckpt_dir_final, weights_sha256

    weights = {"net.0.weight": torch.arange(6.0).reshape(2, 3), "net.0.bias": torch.ones(2)}
    finals = []
    for run, where in (("a", "/node-0/ckpt"), ("b", "/elsewhere/ckpt")):
        uri = (tmp_path / run / "bucket").as_uri()
        node = _node(tmp_path / run, uri)
        for step in (4, 8):
            state = {k: v * step for k, v in weights.items()}
            callbacks = {"ModelCheckpoint": {"dirpath": where}}
            torch.save({"state_dict": state, "callbacks": callbacks, "global_step": step},
                       node.path / f"epoch={step // 4 - 1}-step={step}.ckpt")  # fmt: skip
        node.sync(), node.sync()
        finals.append(ckpt_dir_final(uri))
    assert finals[0] == finals[1] and finals[0] is not None
    assert finals[0]["steps"] == 8 and finals[0]["weights_file"] == "epoch=1-step=8.ckpt"
    plain = io.BytesIO()
    torch.save({k: v * 8 for k, v in weights.items()}, plain)  # a script's final.pt
    assert weights_sha256(plain.getvalue(), "final.pt") == finals[0]["weights_sha256"]
    uri = (tmp_path / "hf" / "bucket").as_uri()
    node = _node(tmp_path / "hf", uri)
    (node.path / "checkpoint-10").mkdir()
    data = save_safetensors(weights, metadata={"format": "pt"})
    (node.path / "checkpoint-10" / "model.safetensors").write_bytes(data)
    node.sync(), node.sync()
    final = ckpt_dir_final(uri)
    assert final is not None and final["weights_file"] == "checkpoint-10/model.safetensors"
    assert final["weights_sha256"] == weights_sha256(save_safetensors(weights), "x.safetensors")
    changed = tmp_path / "hf" / "bucket" / layout.CKPT_DIR_NAME / "checkpoint-10"
    (changed / "model.safetensors").write_bytes(data[:-4] + b"\xff" * 4)  # the same size
    assert ckpt_dir_final(uri) is None


def test_goodput_without_steps_is_unknown_never_a_made_up_split(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A script that reports no steps (no callback, no `report`): goodput says so."""
    from mncloud.cli import follow
    from mncloud.records.goodput import StepMark, Telemetry, goodput_ledger
    from tests.test_goodput import _record

    record = _record(2, ("launch", 0.0), ("preemption", 30.0), ("recovery", 40.0),
                     ("finish", 100.0))  # fmt: skip
    telemetry = Telemetry(steps=None)
    monkeypatch.setattr("mncloud.records.store.load_current", lambda _name: record)
    monkeypatch.setattr(
        "mncloud.operate.run_goodput", lambda rec: goodput_ledger(rec, telemetry, now=100.0)
    )
    line = follow.goodput_line("r")
    assert line is not None and line.startswith("goodput unknown: the script reports no steps")
    assert "%" not in line, line
    telemetry = Telemetry(steps=[StepMark(t=1.0 + i, step=i + 1) for i in range(25)])
    line = follow.goodput_line("r")
    assert line is not None and line.startswith("goodput ") and "%" in line, line


def _sha_of_tensors(data: bytes) -> str:
    import torch

    state = torch.load(io.BytesIO(data), weights_only=True)
    digest = hashlib.sha256()
    for key in sorted(state):
        digest.update(key.encode() + state[key].numpy().tobytes())
    return digest.hexdigest()


# --------------------------------------------------------------------------- end to end

FLAGS = ["--nodes", "2", "--gpus", "cpu:1", "--ckpt-dir", "/ckpt", "--recovery-delay", "0.5s"]


def _bucket_keys(uri: str) -> list[str]:
    from mncloud.storage import open_bucket

    bucket, prefix = open_bucket(layout.ckpt_dir_uri(uri), retry_seconds=5)
    base = f"{prefix}/" if prefix else ""
    return [o.key[len(base) :] for o in bucket.list(base)]


def _bucket_file(uri: str, path: str) -> bytes:
    from mncloud.storage import join_key, open_bucket

    bucket, prefix = open_bucket(layout.ckpt_dir_uri(uri), retry_seconds=5)
    return bucket.get_bytes(join_key(prefix, path))


def _last_step(uri: str) -> int | None:
    """The step of the `last.ckpt` (Lightning's) the bucket holds, None without one."""
    import torch

    if "last.ckpt" not in _bucket_keys(uri):
        return None
    data = torch.load(io.BytesIO(_bucket_file(uri, "last.ckpt")), weights_only=False)
    return int(data["global_step"])


def _last_ckpt_from_step_8(uri: str) -> bool:
    """`ckpt_path="last"` would resume from step 8 or later (the newest `epoch=…` file
    reaches the bucket before the `last.ckpt` Lightning writes after it)."""
    return (_last_step(uri) or 0) >= 8


def _at_kill(uri: str) -> dict[str, Any]:
    """The bucket's `--ckpt-dir` as the preempted node left it: the newest committed unit and
    the step of `last.ckpt` (Lightning's), read before the relaunch can save anything."""
    from mncloud.storage.folders import survey

    verdicts = survey(uri)
    committed = [v.name for v in verdicts if v.committed]
    return {"newest": newest(committed), "last_step": _last_step(uri),
            "names": {v.name: v.committed for v in verdicts}}  # fmt: skip


def _wide(*args: str) -> str:
    """`mncloud ARGS`' output, 250 columns wide (a unit's name whole in `status`'s table)."""
    from typer.testing import CliRunner

    from mncloud.cli import app

    result = CliRunner().invoke(app, list(args), env={"COLUMNS": "250"})
    assert result.exit_code == 0, result.output
    return result.output


def _preempted_once(
    tmp_path_factory: pytest.TempPathFactory, s3_server: Any, name: str, script: Path,
    args: list[str], ready: Any, final: str, chaos: tuple[str, ...] = ("--node", "1"),
    flags: tuple[str, ...] = (),
    before: Any = None,
) -> dict[str, Any]:  # fmt: skip
    """`script` on 2 local nodes under `--ckpt-dir` in S3, preempted once (`chaos preempt` with
    `chaos`) when `ready(uri)` holds for the run's bucket (`before(name, uri)` first, if
    given); the uninterrupted reference of the same script runs beside the relaunch (started
    after the preemption: it puts no load on the race to preempt the run before it ends).
    `status`, `ckpt ls` and the summary's figures are read once it ended."""
    from mncloud.backends.local.figures import recovery_figures
    from mncloud.backends.local.state import node_ckpt_dir
    from mncloud.cli.follow import ckpt_dir_line, goodput_line
    from mncloud.layout import run_dir
    from tests.reference import start_reference_ckpt_dir_file
    from tests.servers import use_s3
    from tests.test_local import cli, run_log, run_series, up, wait_final, wait_until

    home = tmp_path_factory.mktemp(f"{name}-home")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MNCLOUD_HOME", str(home))
        use_s3(s3_server, mp)
        bucket = s3_server.make_bucket()
        up(name, script, *FLAGS, *flags, "--bucket", f"s3://{bucket}/exp", script_args=args)
        uri = f"s3://{bucket}/exp/{name}"
        wait_until(lambda: ready(uri), 400, "a checkpoint in the bucket")
        changed = before(name, uri) if before is not None else None
        said = cli("chaos", "preempt", name, *chaos).output
        at_kill = _at_kill(uri)
        reference = start_reference_ckpt_dir_file(script, [*FLAGS, *flags], args, final)
        state = wait_final(name, timeout=400)
        log = run_log(name)
        starts = [e.data for e in run_series(name).events if e.event == "start"]
        out = {
            "state": state, "log": log, "uri": uri, "keys": _bucket_keys(uri),
            "final": _bucket_file(uri, final) if state.state.value == "SUCCEEDED" else b"",
            "starts": starts, "folder_line": ckpt_dir_line(name, uri),
            "chaos": said, "at_kill": at_kill,
            "goodput_line": goodput_line(name),
            "node_dirs": {n: sorted(os.listdir(node_ckpt_dir(run_dir(name), n)))
                          for n in (0, 1)},
            "status": _wide("status", name), "ls": _wide("ckpt", "ls", name),
            "figures": recovery_figures(run_dir(name)), "changed": changed,
            "reference": reference(),
        }  # fmt: skip
    return out


HF_SCRIPT = REPO / "examples" / "hf_trainer.py"
# Every checkpoint kept: 5 committed by the preemption, 7.5 s of steps after it.
HF_ARGS = ["--max-steps", "80", "--save-steps", "10", "--save-total-limit", "0",
           "--compute-ms", "250"]  # fmt: skip


def _committed(step: int) -> Any:
    markers = {f"{COMMITS}/checkpoint-{step}/node-{n}.json" for n in (0, 1)}  # both shares
    return lambda uri: markers <= set(_bucket_keys(uri))


@pytest.fixture(scope="module")
def hf_run(tmp_path_factory: pytest.TempPathFactory, s3_server: Any) -> dict[str, Any]:
    """The Trainer example, preempted once after checkpoint-10 … checkpoint-50 were
    committed."""
    pytest.importorskip("transformers")
    return _preempted_once(
        tmp_path_factory, s3_server, "hf", HF_SCRIPT, HF_ARGS, _committed(50),
        "final/model.safetensors",
    )  # fmt: skip


@pytest.mark.slow
@pytest.mark.catalog
def test_hf_trainer_preempted_once_resumes_and_finishes(hf_run: dict[str, Any]) -> None:
    """The relaunch resumes from the newest committed checkpoint (the Trainer's optimizer
    loaded onto `cpu:0` through the site hook) and finishes: without the hook every attempt
    after the preemption dies in `_load_optimizer_and_scheduler`."""
    state = hf_run["state"]
    assert state.state.value == "SUCCEEDED", hf_run["log"]
    assert (state.restarts, state.preemptions) == (1, 1)
    newest = hf_run["at_kill"]["newest"]
    assert [s.get("resumed_from") for s in hf_run["starts"]][-1] == newest.step, hf_run["starts"]
    assert "checkpoint-80/model.safetensors" in hf_run["keys"]


@pytest.mark.slow
@pytest.mark.catalog
def test_hf_trainer_with_5_committed_checkpoints_restores_the_newest_only_on_each_node(
    hf_run: dict[str, Any],
) -> None:
    """#57's acceptance: 5 (or more) committed `checkpoint-N/` when preempted; each node of
    the relaunch gets the newest only (the example names no best), the Trainer resumes from
    it, the older ones stay in the bucket, listed, never deleted; the final weights are the
    uninterrupted run's (`test_hf_trainer_preempted_once_ends_on_the_uninterrupted_weights`)."""
    run = hf_run
    newest = run["at_kill"]["newest"]
    older = [f"checkpoint-{s}" for s in range(10, newest.step, 10)]
    assert newest.step >= 50 and all(run["at_kill"]["names"][u] for u in older), run["at_kill"]
    said = f"left in the bucket, not restored: {', '.join(older)} (older than {newest.name}"
    assert said in run["log"], run["log"]
    for n, entries in run["node_dirs"].items():  # what each node held at the end
        got = sorted((e for e in entries if e.startswith("checkpoint-")), key=entry_step)
        assert got == [f"checkpoint-{s}" for s in range(newest.step, 90, 10)], (n, entries)
    for unit in older:
        assert {f"{COMMITS}/{unit}/node-{n}.json" for n in (0, 1)} <= set(run["keys"]), unit
    assert run["final"] == run["reference"]


@pytest.mark.slow
@pytest.mark.catalog
def test_hf_trainer_preempted_once_ends_on_the_uninterrupted_weights(
    hf_run: dict[str, Any],
) -> None:
    """`set_seed(0)` before the model is built, `full_determinism=True`, `seed=0`,
    `data_seed=0`: the same safetensors bytes."""
    state = hf_run["state"]
    assert state.state.value == "SUCCEEDED", hf_run["log"]
    assert (state.restarts, state.preemptions) == (1, 1)
    newest = hf_run["at_kill"]["newest"]
    assert [s.get("resumed_from") for s in hf_run["starts"]][-1] == newest.step, hf_run["starts"]
    assert hf_run["final"] == hf_run["reference"]


@pytest.mark.slow
@pytest.mark.catalog
def test_hf_trainer_run_summary_names_its_folder_and_counts_its_steps(
    hf_run: dict[str, Any],
) -> None:
    assert hf_run["folder_line"] == "newest checkpoint in --ckpt-dir /ckpt: checkpoint-80 (step 80)"
    line = hf_run["goodput_line"]
    assert line is not None and line.startswith("goodput ") and "unknown" not in line, line
    assert "%" in line and not line.startswith("goodput 0%"), line
    _agree(hf_run, "checkpoint-80", 80)
    assert hf_run["figures"].final["weights_file"] == "checkpoint-80/model.safetensors"


@pytest.fixture(scope="module")
def hf_save_run(tmp_path_factory: pytest.TempPathFactory, s3_server: Any) -> dict[str, Any]:
    """The Trainer example, node 1 preempted while it saves a checkpoint folder after
    checkpoint-20 was committed (at 30 to 80: the processes are still running at the last
    save); its reference is `hf_run`'s (the same arguments)."""
    pytest.importorskip("transformers")
    return _preempted_once(
        tmp_path_factory, s3_server, "hfsave", HF_SCRIPT, HF_ARGS, _committed(20),
        "final/model.safetensors", chaos=("--node", "1", "--during-save"),
    )  # fmt: skip


@pytest.mark.slow
@pytest.mark.catalog
def test_hf_trainer_preempted_during_a_save_resumes_from_the_folder_before_it(
    hf_save_run: dict[str, Any],
) -> None:
    """The real Trainer's `checkpoint-N/` lost with node 1 while written or uploaded: the
    relaunch restores only the committed folders, the Trainer resumes from the one before
    (never from N, never from a torn copy of it) and ends on the uninterrupted weights."""
    run = hf_save_run
    struck = re.search(r"while it saved (?:tmp-)?checkpoint-(\d+)/", run["chaos"])
    assert struck is not None, run["chaos"]
    torn = int(struck[1])
    before = run["at_kill"]["newest"]
    assert before is not None and before.step < torn, (run["at_kill"], run["chaos"])
    state = run["state"]
    assert state.state.value == "SUCCEEDED", run["log"]
    assert (state.restarts, state.preemptions) == (1, 1)
    assert [s.get("resumed_from") for s in run["starts"]][-1] == before.step, run["starts"]
    if f"checkpoint-{torn}" in run["at_kill"]["names"]:  # part of it had reached the bucket
        assert not run["at_kill"]["names"][f"checkpoint-{torn}"], run["at_kill"]
        assert f"checkpoint-{torn} kept aside in the bucket, never restored" in run["log"]
    assert run["final"] == run["reference"]


PL_SCRIPT = REPO / "examples" / "lightning_train.py"
# Dropout: its masks resume exactly only from the RNG states mncloud's callback keeps.
# `--logger`: Lightning's default logger writes lightning_logs/ into the folder (logs, kept
# file by file: never a torn checkpoint).
PL_ARGS = ["--epochs", "10", "--samples", "256", "--dropout", "0.5", "--compute-ms", "250",
           "--logger"]  # fmt: skip


@pytest.fixture(scope="module")
def pl_run(tmp_path_factory: pytest.TempPathFactory, s3_server: Any) -> dict[str, Any]:
    """The Lightning example with dropout (4 steps an epoch), preempted once the bucket's
    `last.ckpt` is of step 8 or later (one file at a time: ModelCheckpoint keeps the newest
    epoch's)."""
    pytest.importorskip("lightning")
    return _preempted_once(
        tmp_path_factory, s3_server, "pl", PL_SCRIPT, PL_ARGS,
        _last_ckpt_from_step_8, "final.pt",
    )  # fmt: skip


@pytest.mark.slow
@pytest.mark.catalog
def test_lightning_preempted_once_ends_on_the_uninterrupted_weights(
    pl_run: dict[str, Any],
) -> None:
    """`seed_everything(0, workers=True)`, `deterministic=True`, checkpoints at epoch ends,
    and each rank's RNG states put back from the checkpoint by mncloud's callback (without them
    the resumed run's dropout masks differ, and so do its weights): the same tensors
    (torch.save's bytes carry a fresh serialization id each time)."""
    state = pl_run["state"]
    assert state.state.value == "SUCCEEDED", pl_run["log"]
    assert (state.restarts, state.preemptions) == (1, 1)
    assert pl_run["starts"][-1].get("resumed_from", 0) >= 8, pl_run["starts"]
    assert _sha_of_tensors(pl_run["final"]) == _sha_of_tensors(pl_run["reference"])
    assert (
        pl_run["folder_line"]
        == "newest checkpoint in --ckpt-dir /ckpt: epoch=9-step=40.ckpt (step 40)"
    )
    assert "unknown" not in (pl_run["goodput_line"] or "unknown"), pl_run["goodput_line"]
    _agree(pl_run, "epoch=9-step=40.ckpt", 40)


def _agree(run: dict[str, Any], unit: str, step: int) -> None:
    """`status`, `ckpt ls` and the run's summary name the same newest unit; the summary's
    final weights are that unit's, which the reference comparison reads; a logger's folder
    is never reported torn."""
    name = run["state"].name
    row = next(line for line in run["status"].splitlines() if line.startswith(f"│ {name} "))
    assert f" {unit} " in row, run["status"]
    assert "keeps aside" not in run["status"], run["status"]
    assert f"newest committed checkpoint: {unit} (step {step})" in run["ls"], run["ls"]
    assert "incomplete" not in run["ls"] and "no checkpoints at" not in run["ls"], run["ls"]
    assert run["folder_line"].endswith(f": {unit} (step {step})"), run["folder_line"]
    final = run["figures"].final
    assert final["steps"] == step and final["weights_file"].startswith(unit), final


@pytest.mark.slow
def test_profile_counts_the_hf_trainers_own_steps() -> None:
    """`mncloud profile` on a Trainer script: the callback the site hook adds hands the
    Trainer's steps to the profiler; one step's FLOPs are the model's (6 × params × tokens,
    with attention and the LM head on top)."""
    pytest.importorskip("transformers")
    from mncloud.plan.profile import run_profile

    profile = run_profile(HF_SCRIPT, ["--max-steps", "20"])
    assert profile.tokens_per_step == 256 and profile.samples_per_step == 8
    dense = 6 * profile.params * profile.tokens_per_step
    assert dense <= profile.flops_per_step <= 2 * dense, (profile.flops_per_step, dense)
    # AdamW: two moments a parameter, and a scalar `step` tensor each
    assert 2 * profile.grad_bytes < profile.optimizer_bytes < 2.01 * profile.grad_bytes
    assert profile.steps_timed >= 3


@pytest.fixture(scope="module")
def pl_save_run(tmp_path_factory: pytest.TempPathFactory, s3_server: Any) -> dict[str, Any]:
    """The Lightning example, node 0 (the one that saves: global rank 0) preempted while a
    `.ckpt` file it saved is not yet in the bucket, once the bucket's `last.ckpt` is of step 8
    or later; its reference is `pl_run`'s (the same arguments)."""
    pytest.importorskip("lightning")
    return _preempted_once(
        tmp_path_factory, s3_server, "plsave", PL_SCRIPT, PL_ARGS,
        _last_ckpt_from_step_8, "final.pt",
        chaos=("--node", "0", "--during-save"),
    )  # fmt: skip


@pytest.mark.slow
@pytest.mark.catalog
def test_lightning_preempted_during_a_save_resumes_from_the_last_ckpt_in_the_bucket(
    pl_save_run: dict[str, Any],
) -> None:
    """The `.ckpt` being saved is lost with node 0: `ckpt_path="last"` resumes from the
    `last.ckpt` the bucket held whole when the node vanished, and the run ends on the
    uninterrupted weights."""
    run = pl_save_run
    struck = re.search(r"while it saved (\S+\.ckpt) ", run["chaos"])
    assert struck is not None, run["chaos"]
    last = run["at_kill"]["last_step"]
    assert last is not None and last >= 8, run["at_kill"]
    saving = entry_step(struck[1])
    assert saving is None or saving > last, (struck[1], last)  # None: last.ckpt itself
    state = run["state"]
    assert state.state.value == "SUCCEEDED", run["log"]
    assert (state.restarts, state.preemptions) == (1, 1)
    assert run["starts"][-1].get("resumed_from") == last, run["starts"]
    assert _sha_of_tensors(run["final"]) == _sha_of_tensors(run["reference"])


def _flip_a_tensor(data: bytes) -> bytes:
    """A torch file with 64 bytes of its largest tensor flipped: the same size, and torch.load
    still reads it (it checks no CRC): a checkpoint that loads other weights without a word."""
    import struct
    import zipfile

    info = max(
        (i for i in zipfile.ZipFile(io.BytesIO(data)).infolist() if "/data/" in i.filename),
        key=lambda i: i.file_size,
    )
    name_len, extra_len = struct.unpack(
        "<HH", data[info.header_offset + 26 : info.header_offset + 30]
    )
    at = info.header_offset + 30 + name_len + extra_len
    return data[:at] + bytes(b ^ 0xFF for b in data[at : at + 64]) + data[at + 64 :]


def _change_last_ckpt(name: str, uri: str) -> bytes:
    """Node 0 (the one that saves) loses its disk as `chaos preempt` makes it (nothing more of
    it reaches the bucket), then the bucket's committed `last.ckpt` is changed, the same size;
    `chaos preempt --node 0` kills the node next. Returns the changed bytes."""
    from mncloud.backends.local.ckptdir import lose_disk
    from mncloud.layout import run_dir
    from mncloud.storage import join_key, open_bucket
    from mncloud.storage.folders import survey

    with lose_disk(run_dir(name), 0):
        assert {v.name: v.committed for v in survey(uri)}.get("last.ckpt"), survey(uri)
        bad = _flip_a_tensor(_bucket_file(uri, "last.ckpt"))
        bucket, prefix = open_bucket(layout.ckpt_dir_uri(uri), retry_seconds=5)
        bucket.put_bytes(join_key(prefix, "last.ckpt"), bad)
    return bad


@pytest.fixture(scope="module")
def pl_changed_run(tmp_path_factory: pytest.TempPathFactory, s3_server: Any) -> dict[str, Any]:
    """The Lightning example, preempted once (node 0) as `pl_run`, its committed `last.ckpt`
    changed in the bucket (the same size) before the relaunch; its reference is `pl_run`'s."""
    pytest.importorskip("lightning")
    return _preempted_once(
        tmp_path_factory, s3_server, "plchanged", PL_SCRIPT, PL_ARGS,
        _last_ckpt_from_step_8, "final.pt", chaos=("--node", "0"), before=_change_last_ckpt,
    )  # fmt: skip


@pytest.mark.slow
@pytest.mark.catalog
def test_lightning_last_ckpt_changed_in_the_bucket_is_refused_and_the_run_ends_right(
    pl_changed_run: dict[str, Any],
) -> None:
    """The changed `last.ckpt` fails its record: never restored (Lightning would load other
    weights from it), named in the run's log; the newest `epoch=…-step=….ckpt` stands in for
    it, `ckpt_path="last"` resumes from that, and the run ends on the uninterrupted weights,
    which the summary's figure (the newest unit's) equals."""
    from mncloud.storage.final import weights_sha256

    run = pl_changed_run
    state = run["state"]
    assert state.state.value == "SUCCEEDED", run["log"]
    assert (state.restarts, state.preemptions) == (1, 1)
    newest = run["at_kill"]["newest"]  # the newest committed epoch file when node 0 vanished
    assert newest is not None and newest.step >= 8, run["at_kill"]
    kept = "last.ckpt kept aside in the bucket, never restored: refused: last.ckpt fails its "
    assert kept + "content hash" in run["log"], run["log"]
    assert f"last.ckpt is a copy of {newest.name}" in run["log"], run["log"]
    assert run["starts"][-1].get("resumed_from") == newest.step, run["starts"]
    assert _sha_of_tensors(run["final"]) == _sha_of_tensors(run["reference"])
    reference = weights_sha256(run["reference"], "final.pt")
    assert run["figures"].final["weights_sha256"] == reference  # the summary's comparison
    assert " lightning_logs/ " in run["ls"] and "yes (logs" in run["ls"], run["ls"]
    _agree(run, "epoch=9-step=40.ckpt", 40)
