"""Elastic spot runs (`--min-nodes`): a run trains on the nodes spot capacity gives (at least
`--min-nodes`) instead of waiting for the whole gang, and grows back at the next checkpoint."""

from __future__ import annotations

from pathlib import Path

import pytest

from mncloud.errors import SpecError


@pytest.mark.catalog
@pytest.mark.parametrize(
    ("flags", "shown"),
    [
        (["--nodes", "4", "--min-nodes", "5"], "--min-nodes 5"),
        (["--nodes", "2", "--min-nodes", "0"], "--min-nodes 0"),
        (["--nodes", "2", "--min-nodes", "-1"], "--min-nodes -1"),
        (["--min-nodes", "2"], "--min-nodes 2"),  # --nodes defaults to 1
    ],
)
def test_bad_min_nodes_is_one_line_and_launches_nothing(flags: list[str], shown: str) -> None:
    from mncloud.cli import app
    from tests.test_local import runner, state_of

    script = "examples/train_ddp.py"
    args = ["up", script, "--cloud", "local", "--gpus", "cpu:2", "--name", "bad-min", *flags]
    result = runner.invoke(app, [*args, "--yes", "--detach"])
    assert result.exit_code == 2, result.output
    assert shown in result.output and "from 1 to --nodes" in result.output
    assert "Traceback" not in result.output and len(result.output.strip().splitlines()) == 1
    with pytest.raises(Exception):  # noqa: B017 - no run was recorded under the name
        state_of("bad-min")


def test_min_nodes_above_nodes_is_refused_by_the_spec_too(tmp_path: Path) -> None:
    from mncloud.request import build_spec

    script = tmp_path / "train.py"
    script.write_text("print('hi')\n")
    spec = build_spec(script, gpus="cpu:1", nodes=4, min_nodes=2, cloud="local")
    assert spec.min_nodes == 2
    with pytest.raises(ValueError, match="--min-nodes 3: give a whole number"):
        spec.updated(nodes=2, min_nodes=3)
    with pytest.raises(SpecError, match="--min-nodes 0"):
        build_spec(script, gpus="cpu:1", nodes=4, min_nodes=0, cloud="local")
