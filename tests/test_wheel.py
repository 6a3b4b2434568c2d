"""The built wheel, installed (not editable) into a fresh environment, renders a task.

So the templates and other package data ship. Offline and quick: the wheel is built without
build isolation (this environment's setuptools), and the fresh environment reads its
dependencies from this one's site-packages through a .pth line instead of downloading them.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]


def _run(*argv: str | Path, cwd: Path | None = None) -> str:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "MNCLOUD_CATALOG_DIR")}
    done = subprocess.run(
        [str(a) for a in argv], cwd=cwd, env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, f"{argv}\n{done.stdout}\n{done.stderr}"
    return done.stdout


@pytest.mark.slow
def test_the_installed_wheel_renders_a_task(tmp_path: Path) -> None:
    source = tmp_path / "source"  # a copy, so the build leaves the checkout as it was
    shutil.copytree(REPO / "mncloud", source / "mncloud", ignore=shutil.ignore_patterns("__py*"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, source)
    wheels = tmp_path / "wheels"
    pip = (sys.executable, "-m", "pip")
    _run(*pip, "wheel", "--quiet", "--no-deps", "--no-build-isolation", "-w", wheels, source)
    (wheel,) = wheels.glob("mncloud-*.whl")

    venv = tmp_path / "venv"
    _run(sys.executable, "-m", "venv", "--without-pip", venv)
    python = venv / "bin" / "python"
    site = _run(python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])")
    # Plain sys.path entry: this environment's .pth files (the editable checkout) are not read.
    (Path(site.strip()) / "deps.pth").write_text(sysconfig.get_paths()["purelib"])
    _run(*pip, "--python", python, "install", "--quiet", "--no-deps", wheel)

    where = _run(python, "-c", "import mncloud; print(mncloud.__file__)", cwd=tmp_path)
    assert where.startswith(str(venv)), where

    project = tmp_path / "project"
    project.mkdir()
    (project / "pyproject.toml").write_text("[project]\nname='p'\n")
    (project / "train.py").write_text("print('hi')\n")
    args = ("render", "train.py", "--gpus", "cpu:2", "--nodes", "2", "--", "--lr", "1")
    task = yaml.safe_load(_run(venv / "bin" / "mncloud", *args, cwd=project))
    assert task["num_nodes"] == 2
    assert "torchrun" in task["run"] and "--lr" in task["run"]
