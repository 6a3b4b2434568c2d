"""`wrap_ddp` under a real torchrun with 4 ranks: a model re-wrapped mid-training (what a
resume does) ends bitwise-identical to one trained straight through, and DDP prints no
`find_unused_parameters` performance warning."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("torch", reason="mncloud.train needs torch")

from .servers import free_port

SCRIPT = textwrap.dedent(
    """
    import copy, sys, torch
    from mncloud.train import cleanup, init_distributed, is_main, wrap_ddp

    init_distributed(backend="gloo")
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    rank = torch.distributed.get_rank()
    exact = sys.argv[1] == "exact"

    def make():  # > 1 MiB of weights: plain DDP uses several buckets after its rebuild
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Linear(64, 700), torch.nn.ReLU(),
                                   torch.nn.Linear(700, 700), torch.nn.ReLU(),
                                   torch.nn.Linear(700, 1))

    def train(model, opt, first, last):
        for step in range(first, last):
            g = torch.Generator().manual_seed(1000 * step + rank)
            x, y = torch.randn(16, 64, generator=g), torch.randn(16, 1, generator=g)
            opt.zero_grad()
            ((model(x) - y) ** 2).mean().backward()
            opt.step()

    def sgd(model):
        return torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

    model = wrap_ddp(make(), exact=exact)
    opt = sgd(model)
    train(model, opt, 0, 6)
    straight = [p.detach().clone() for p in model.parameters()]

    model = wrap_ddp(make(), exact=exact)
    opt = sgd(model)
    train(model, opt, 0, 3)
    weights, moments = copy.deepcopy(model.module.state_dict()), copy.deepcopy(opt.state_dict())
    fresh = make()
    fresh.load_state_dict(weights)
    resumed = wrap_ddp(fresh, exact=exact)  # a new DDP: a new bucket layout, as after a restart
    opt = sgd(resumed)
    opt.load_state_dict(moments)
    train(resumed, opt, 3, 6)
    same = all(torch.equal(a, b) for a, b in zip(straight, resumed.parameters()))
    if is_main():
        print("IDENTICAL" if same else "DIFFERENT")
    cleanup()
    """
)


def _run(tmp_path: Path, mode: str) -> subprocess.CompletedProcess[str]:
    torchrun = Path(sys.executable).parent / "torchrun"
    if not torchrun.exists():
        pytest.skip("torchrun not found beside the Python interpreter")
    script = tmp_path / "ddp.py"
    script.write_text(SCRIPT)
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": os.pathsep.join(
            filter(None, [str(Path(__file__).parents[1]), os.environ.get("PYTHONPATH")])
        ),
    }
    cmd = [str(torchrun), "--nnodes=1", "--nproc_per_node=4", f"--master_port={free_port()}",
           str(script), mode]  # fmt: skip
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240)


@pytest.mark.slow
def test_wrap_ddp_resumes_exactly_without_the_unused_parameters_warning(tmp_path: Path) -> None:
    exact = _run(tmp_path, "exact")
    assert exact.returncode == 0, exact.stderr[-3000:]
    assert "IDENTICAL" in exact.stdout
    assert "find_unused_parameters" not in exact.stderr + exact.stdout
    plain = _run(tmp_path, "plain")  # the control: plain DDP re-buckets and drifts
    assert plain.returncode == 0, plain.stderr[-3000:]
    assert "DIFFERENT" in plain.stdout
