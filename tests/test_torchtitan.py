"""torchtitan's own trainer through mncloud (`mncloud/train/titan.py`, its example in
examples/torchtitan_train.py): what the site hook supplies on a CPU-only node (checked against
torch's own flex attention and torchtitan's own modules), and a real 2-node local run of
`torchtitan.train` on gloo, preempted once, that resumes from its DCP `step-N/` folder restored
whole from the bucket."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from mncloud import layout
from mncloud.train import sitehook, titan

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "examples" / "torchtitan_train.py"


def test_the_site_hook_watches_what_mncloud_acts_on() -> None:
    """The hook's own list (it imports nothing of mncloud at start) is torch and
    `sitehook.WATCHED`."""
    source = layout.site_hook_source().read_text()
    block = source[source.index("_WATCHED = (") : source.index(")  #", source.index("_WATCHED"))]
    assert tuple(re.findall(r'"([\w.]+)"', block)) == ("torch", *sitehook.WATCHED)


def test_dense_flex_attention_matches_torch_s_own_and_has_a_backward_on_cpu() -> None:
    """Forward against torch's flex attention (which CPU runs forward, never backward), causal
    block mask, grouped-query heads, with the log-sum-exp."""
    import torch
    from torch.nn.attention.flex_attention import AuxRequest, create_block_mask, flex_attention

    gen = torch.Generator().manual_seed(0)
    q = torch.randn(2, 4, 16, 8, generator=gen, requires_grad=True)
    k, v = (torch.randn(2, 2, 16, 8, generator=gen) for _ in range(2))
    mask = create_block_mask(lambda b, h, i, j: j <= i, 2, 1, 16, 16, device="cpu")
    want, want_aux = flex_attention(q.detach(), k, v, block_mask=mask, enable_gqa=True,
                                    return_aux=AuxRequest(lse=True))  # fmt: skip
    got, aux = titan.dense_flex_attention(q, k, v, block_mask=mask, enable_gqa=True,
                                          return_aux=AuxRequest(lse=True))  # fmt: skip
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(aux.lse, want_aux.lse, rtol=1e-5, atol=1e-5)
    got.sum().backward()
    assert q.grad is not None and torch.isfinite(q.grad).all()
    with pytest.raises(NotImplementedError, match="score_mod"):
        titan.dense_flex_attention(q, k, v, score_mod=lambda s, *_: s)


def test_triton_is_stood_in_only_while_a_gpu_kernel_module_imports() -> None:
    assert "triton" not in sys.modules
    with titan.importing("torchtitan.overrides.fused_swiglu"):
        import triton  # type: ignore[import-not-found]

        @triton.jit
        def kernel() -> int:
            return 7

        assert kernel() == 7 and triton.language.constexpr is not None
    assert "triton" not in sys.modules
    with titan.importing("torchtitan.trainer"):
        assert "triton" not in sys.modules


def test_torchtitan_on_a_cpu_node_through_the_site_hook(tmp_path: Path) -> None:
    """The real modules, imported with the hook on the path: the CPU device, gloo's SUM
    reductions, dense attention, the step reports."""
    pytest.importorskip("torchtitan")
    from mncloud.backends.local.nodes import site_hook

    code = (
        "from torchtitan.tools import utils; from torchtitan.distributed import fsdp; "
        "from torchtitan.models.common import attention; from torchtitan.trainer import Trainer; "
        "import torch.distributed as d, mncloud.train.titan as t; "
        "print(utils.device_type, utils.device_module.current_device(), "
        "fsdp.disable_fsdp_gradient_division.__code__.co_filename.endswith('titan.py'), "
        "attention.FlexAttention._compiled_flex_attn is t.dense_flex_attention, "
        "Trainer.train_step._mncloud, hasattr(d, 'set_timeout'), "
        "__import__('torchtitan.components.checkpointer.dcp').components.checkpointer.dcp."
        "CheckpointManager.save._mncloud)"
    )
    env = {"PYTHONPATH": str(site_hook(tmp_path)), "PATH": "/usr/bin:/bin"}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "site hook skipped" not in done.stderr, done.stderr
    assert done.stdout.split() == ["cpu", "0", "True", "True", "True", "True", "True"]


def test_a_first_save_outside_the_ckpt_dir_is_warned_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """torchtitan's `CheckpointManager.save` as the hook wraps it (it returns whether it saved;
    `folder` is its `checkpoint.folder`): one line at the first save, none before or after."""
    import logging

    from mncloud.constants import CKPT_DIR_ENV

    class Manager:
        folder = str(tmp_path / "elsewhere")

        def save(self, curr_step: int, last_step: bool = False) -> bool:
            return curr_step % 5 == 0 or last_step

    titan._check_first_save(Manager)
    titan._check_first_save(Manager)  # wrapped once
    monkeypatch.setenv(CKPT_DIR_ENV, str(tmp_path / "ckpt"))
    manager = Manager()
    with caplog.at_level(logging.WARNING):
        assert [manager.save(step) for step in (1, 5, 10)] == [False, True, True]
    warned = [r.getMessage() for r in caplog.records if r.getMessage().startswith("mncloud:")]
    assert len(warned) == 1 and str(tmp_path / "elsewhere") in warned[0], warned
    assert "--checkpoint.folder" in warned[0] and "\n" not in warned[0]


def test_the_example_points_torchtitan_at_the_ckpt_dir_and_tiny_assets(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("tokenizers")
    sys.path.insert(0, str(REPO / "examples"))
    try:
        import torchtitan_train as example
    finally:
        sys.path.remove(str(REPO / "examples"))
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr("tempfile.tempdir", None)
    monkeypatch.setenv("MNCLOUD_CKPT_DIR", "/ckpt")
    args = example.torchtitan_args(["--tiny-assets", "--module", "llama3"])
    assert args[:4] == ["--module", "llama3", "--checkpoint.folder", "/ckpt"]
    tokenizer_dir, data_dir = Path(args[5]), Path(args[7])
    assert args[4::2][:2] == ["--hf_assets_path", "--dataloader.dataset_path"]
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json"))
    assert tokenizer.get_vocab_size() <= 512  # within the debug model's vocabulary
    assert len((data_dir / "c4_tiny.json").read_text().splitlines()) == 2000
    mine = ["--checkpoint.folder", "/elsewhere"]
    assert example.torchtitan_args(mine) == mine  # the script's own folder is kept


# --------------------------------------------------------------------------- end to end

STEPS = 15
TITAN_ARGS = [
    "--tiny-assets", "--module", "llama3", "--config", "llama3_debugmodel",
    "--training.seq_len", "128", "--training.local_batch_size", "2",
    "--training.steps", str(STEPS), "--checkpoint.enable", "--checkpoint.interval", "5",
    "--parallelism.spmd_backend", "partial_dtensor", "--metrics.log_freq", "5",
]  # fmt: skip
FLAGS = ["--nodes", "2", "--gpus", "cpu:1", "--ckpt-dir", "/ckpt", "--recovery-delay", "0.5s"]


@pytest.fixture(scope="module")
def titan_run(tmp_path_factory: pytest.TempPathFactory, s3_server: Any) -> dict[str, Any]:
    """torchtitan's trainer on 2 local nodes under `--ckpt-dir` in S3, node 1 preempted once
    both nodes committed their shares of `step-5/`."""
    pytest.importorskip("torchtitan")
    from mncloud.cli.follow import ckpt_dir_line, goodput_line
    from tests.servers import use_s3
    from tests.test_local import cli, run_log, run_series, up, wait_final, wait_until
    from tests.test_trainers import _bucket_keys

    markers = {f".mncloud-commits/step-5/node-{n}.json" for n in (0, 1)}
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MNCLOUD_HOME", str(tmp_path_factory.mktemp("titan-home")))
        use_s3(s3_server, mp)
        uri = f"s3://{s3_server.make_bucket()}/exp/titan"
        dump = str(tmp_path_factory.mktemp("titan-dump"))  # torchtitan's logs, not in the repo
        up("titan", SCRIPT, *FLAGS, "--bucket", uri.removesuffix("/titan"),
           script_args=[*TITAN_ARGS, "--dump_folder", dump])  # fmt: skip
        wait_until(lambda: markers <= set(_bucket_keys(uri)), 400, "step-5 committed")
        cli("chaos", "preempt", "titan", "--node", "1")
        state = wait_final("titan", timeout=400)
        return {
            "state": state, "log": run_log("titan"), "keys": _bucket_keys(uri),
            "starts": [e.data for e in run_series("titan").events if e.event == "start"],
            "folder_line": ckpt_dir_line("titan", uri), "goodput_line": goodput_line("titan"),
        }  # fmt: skip


@pytest.mark.slow
@pytest.mark.catalog
def test_torchtitan_preempted_once_resumes_from_its_dcp_folder(titan_run: dict[str, Any]) -> None:
    state, log = titan_run["state"], titan_run["log"]
    assert state.state.value == "SUCCEEDED", log
    assert (state.restarts, state.preemptions) == (1, 1)
    loaded = re.findall(r"Loading the checkpoint from \S*/step-(\d+)", log)
    assert loaded and int(loaded[-1]) >= 5, log[-3000:]
    step = int(loaded[-1])
    assert f"Training starts at step {step + 1}" in log
    assert titan_run["starts"][-1].get("resumed_from") == step, titan_run["starts"]
    shards = {"step-15/.metadata", "step-15/__0_0.distcp", "step-15/__1_0.distcp"}
    assert shards <= set(titan_run["keys"])  # each node's shard reached the bucket


@pytest.mark.slow
@pytest.mark.catalog
def test_torchtitan_run_summary_names_its_folder_and_counts_its_steps(
    titan_run: dict[str, Any],
) -> None:
    assert titan_run["folder_line"] == (
        f"newest checkpoint in --ckpt-dir /ckpt: step-{STEPS} (step {STEPS})"
    )
    line = titan_run["goodput_line"]
    assert line is not None and line.startswith("goodput ") and "unknown" not in line, line
    assert not line.startswith("goodput 0%"), line


@pytest.mark.slow
def test_profile_counts_torchtitan_s_own_steps(tmp_path: Path) -> None:
    """`mncloud profile` on torchtitan's trainer (a world of one rank): the site hook hands its
    steps to the profiler; one step's FLOPs are the model's (6 × params × tokens, attention on
    top) and AdamW keeps two moments a parameter."""
    pytest.importorskip("torchtitan")
    from mncloud.plan.profile import run_profile

    args = [a for a in TITAN_ARGS if a != "--checkpoint.enable"]
    args += ["--dump_folder", str(tmp_path)]
    profile = run_profile(SCRIPT, args)
    assert profile.tokens_per_step == 2 * 128 and profile.samples_per_step == 2
    dense = 6 * profile.params * profile.tokens_per_step
    assert dense <= profile.flops_per_step <= 1.2 * dense, (profile.flops_per_step, dense)
    assert 2 * profile.grad_bytes <= profile.optimizer_bytes < 2.01 * profile.grad_bytes
    assert profile.steps_timed >= 3
