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
import subprocess
import sys
from pathlib import Path
from typing import Any, ClassVar

import pytest

from mncloud import constants, layout
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
    import lightning.pytorch.trainer.trainer as module

    from mncloud.train import sitehook

    sitehook.imported("lightning.pytorch.trainer.trainer", module)
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

    uri = (tmp_path / "bucket" / "run").as_uri()
    folder = tmp_path / "bucket" / "run" / layout.CKPT_DIR_NAME
    for name in ("checkpoint-20", "checkpoint-40", "tmp-checkpoint-60"):
        (folder / name).mkdir(parents=True)
        (folder / name / "model.safetensors").write_bytes(b"w")

    class Record:
        spec: ClassVar[dict[str, Any]] = {"ckpt_dir": "/ckpt"}
        ckpt_uri = None

    monkeypatch.setattr("mncloud.records.store.load_current", lambda _name: Record())
    assert load_current is not None
    line = follow.ckpt_dir_line("run", uri)
    assert line == "newest checkpoint in --ckpt-dir /ckpt: checkpoint-40 (step 40)"
    Record.spec = {}
    assert follow.ckpt_dir_line("run", uri) is None


def _sha_of_tensors(data: bytes) -> str:
    import torch

    state = torch.load(io.BytesIO(data), weights_only=True)
    digest = hashlib.sha256()
    for key in sorted(state):
        digest.update(key.encode() + state[key].numpy().tobytes())
    return digest.hexdigest()
