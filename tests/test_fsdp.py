"""Sharded training (FSDP2 / HSDP) and a run that resumes on another node count.

The fast tests hold the layout rules (`mncloud.train.parallel`) and the sampler's global cursor
in one process. The slow ones run `examples/train_fsdp.py` under `mncloud up` on the local
backend (real torchrun, gloo): 2 nodes × 2 processes preempted once end on the uninterrupted
run's weights, each rank saves only its shard, the export equals the gathered weights; and a
run stopped at 2 nodes and resumed on 3, then 1, trains every sample once per epoch (read from
the sample ids every rank logged) and ends within 1 % of the uninterrupted run's loss.
"""

from __future__ import annotations

import collections
import hashlib
import importlib.util
import json
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

torch = pytest.importorskip("torch", reason="mncloud.train needs torch")

from mncloud import constants  # noqa: E402
from mncloud.train.parallel import (  # noqa: E402
    ParallelError,
    accumulation_steps,
    mesh_shape,
    parallel_mode,
)
from mncloud.train.sampler import ResumableSampler  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "examples" / "train_fsdp.py"


def _example() -> ModuleType:
    spec = importlib.util.spec_from_file_location("train_fsdp_demo", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# --------------------------------------------------------------------------- fast


def test_mesh_shapes_and_the_layouts_that_cannot_be_built() -> None:
    assert mesh_shape("fsdp", 4, 2) == (4,)
    assert mesh_shape("hsdp", 4, 2) == (2, 2)  # replicate across 2 nodes, shard in each
    assert mesh_shape("hsdp", 16, 8) == (2, 8)
    with pytest.raises(ParallelError, match="2 or more nodes"):
        mesh_shape("hsdp", 2, 2)
    with pytest.raises(ParallelError, match="whole nodes"):
        mesh_shape("hsdp", 6, 4)


def test_the_run_s_choice_overrides_the_script_s(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(constants.PARALLEL_ENV, raising=False)
    assert parallel_mode("fsdp") == "fsdp"
    monkeypatch.setenv(constants.PARALLEL_ENV, "HSDP")
    assert parallel_mode("fsdp") == "hsdp"
    monkeypatch.setenv(constants.PARALLEL_ENV, "zero")
    with pytest.raises(ParallelError, match="not one of ddp, fsdp, hsdp"):
        parallel_mode()


def test_accumulation_keeps_the_global_batch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(constants.RECOVERY_ENV, raising=False)
    assert accumulation_steps(24, 2) == 12  # one process: all 24 samples in 12 micro-batches
    monkeypatch.setenv(constants.RECOVERY_ENV, "node")  # 3 nodes of 1 rank each: 24 / (2 × 3)
    monkeypatch.setenv(constants.NUM_REPLICAS_ENV, "3")
    assert accumulation_steps(24, 2) == 4
    with pytest.raises(ParallelError, match="multiple of 6"):
        accumulation_steps(20, 2)


def _endless(sampler: ResumableSampler) -> Any:
    """The sampler's indices epoch after epoch (as the example's `batches` does)."""
    while True:
        yield from sampler


def _consume(samplers: list[ResumableSampler], steps: int, per_rank: int) -> list[list[int]]:
    """`steps` synchronous steps, each rank taking `per_rank` indices: the ids of each step."""
    iters = [_endless(s) for s in samplers]
    return [[next(it) for it in iters for _ in range(per_rank)] for _ in range(steps)]


def _world(n: int, size: int, state: dict[str, Any] | None) -> list[ResumableSampler]:
    data = list(range(n))
    samplers = [ResumableSampler(data, num_replicas=size, rank=r, seed=7, drop_last=True)
                for r in range(size)]  # fmt: skip
    for s in samplers:
        if state is not None:
            s.load_state_dict(state)
    return samplers


def test_the_cursor_is_global_so_each_sample_comes_once_per_epoch_across_world_changes() -> None:
    """240 samples, a global batch of 24: 7 steps on 4 ranks, 12 on 6 (crossing the epoch
    end), 11 on 2. Every step trains the same 24 samples as an uninterrupted run on one rank."""
    steps: list[list[int]] = []
    state = None
    for size, count in ((4, 7), (6, 12), (2, 11)):
        samplers = _world(240, size, state)
        steps += _consume(samplers, count, 24 // size)
        state = samplers[0].state_dict()
        assert all(s.state_dict() == state for s in samplers)  # one value, the same on all
    straight = _consume(_world(240, 1, None), 30, 24)
    assert [sorted(s) for s in steps] == [sorted(s) for s in straight]
    for epoch in range(3):
        ids = [i for s in steps[10 * epoch : 10 * epoch + 10] for i in s]
        assert sorted(ids) == list(range(240))
    assert state == {"epoch": 2, "cursor": 240, "seed": 7, "position": 120, "num_replicas": 2}


def test_a_resume_on_the_same_world_keeps_each_rank_s_order() -> None:
    """At the same world size each rank gets exactly the indices of a run that never stopped
    (the order a checkpoint of an older mncloud resumed to)."""
    straight = _consume(_world(100, 4, None), 10, 2)
    first = _world(100, 4, None)
    head = _consume(first, 4, 2)
    assert head + _consume(_world(100, 4, first[0].state_dict()), 6, 2) == straight


def test_an_older_checkpoint_s_per_rank_position_still_loads() -> None:
    """Saved by mncloud before the cursor: `{"epoch", "position", "seed"}` of each rank."""
    straight = _consume(_world(100, 4, None), 10, 2)
    old = {"epoch": 0, "position": 8, "seed": 7}
    assert _consume(_world(100, 4, old), 6, 2) == straight[4:]


def test_the_example_trains_in_one_process(monkeypatch: pytest.MonkeyPatch) -> None:
    """The model's shapes and the gathered-weights fingerprint without a process group."""
    demo = _example()
    monkeypatch.setattr("sys.argv", ["train_fsdp.py", "--layers", "1", "--dim", "32"])
    ns = demo.parse_args()
    model = demo.make_model(ns)
    tokens = demo.synthetic_tokens(8, ns.seq_len, ns.vocab, 0).tensors[1]
    logits = model(tokens[:, :-1])
    assert logits.shape == (8 * ns.seq_len, ns.vocab)
    digest, full = demo.weights_sha256(model)
    assert set(full) == set(model.state_dict()) and len(digest) == 64


@pytest.mark.catalog
@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--parallel", "hsdp", "--nodes", "1"], "--parallel hsdp needs --nodes 2 or more"),
        (["--parallel", "zero3"], "--parallel 'zero3' is unknown; choose ddp, fsdp or hsdp"),
    ],
)
def test_bad_parallel_is_one_line_and_launches_nothing(flags: list[str], message: str) -> None:
    from mncloud.cli import app
    from tests.test_local import runner, state_of

    args = ["up", str(EXAMPLE), "--cloud", "local", "--gpus", "cpu:2", "--name", "bad", *flags]
    result = runner.invoke(app, [*args, "--yes", "--detach"])
    assert result.exit_code == 2, result.output
    assert message in result.output and "Traceback" not in result.output
    assert len(result.output.strip().splitlines()) == 1
    with pytest.raises(Exception):  # noqa: B017 - no run was recorded under the name
        state_of("bad")


@pytest.mark.catalog
def test_parallel_reaches_the_script_as_one_env_value() -> None:
    from tests.test_local import cli

    args = ["render", str(EXAMPLE), "--cloud", "local", "--gpus", "cpu:2", "--nodes", "2"]
    assert constants.PARALLEL_ENV not in cli(*args).output  # the script's own choice
    text = cli(*args, "--parallel", "hsdp").output
    assert f"{constants.PARALLEL_ENV}: hsdp" in text


def test_the_preflight_warns_when_the_checkpoint_s_mesh_differs(tmp_path: Path) -> None:
    from mncloud.doctor.mesh import mesh_warnings
    from mncloud.storage import CheckpointStore
    from mncloud.storage.checkpoints import Manifest

    uri = f"file://{tmp_path}/ckpt"
    assert mesh_warnings(uri, 3, 2, None) == []  # nothing saved yet
    mesh = {"shape": [4], "dims": ["shard"], "placements": ["S(0)"]}
    CheckpointStore(uri).commit(Manifest(step=7, world_size=4, files={}, extra={"mesh": mesh}))
    assert mesh_warnings(uri, 2, 2, "fsdp") == []  # the same 4 ranks
    (line,) = mesh_warnings(uri, 3, 2, None)
    assert "step 7 was saved sharded over 4 ranks (mesh 4)" in line
    assert "3 node(s) × 2 = 6: it is resharded on load" in line
    (hsdp,) = mesh_warnings(None, 1, 8, "hsdp")
    assert "hsdp on 1 node" in hsdp


def _save_checkpoint(uri: str, argv: list[str], step: int = 4) -> None:
    """One step of the example's model (built from `argv`) saved as `step` at `uri`, in this
    process: a checkpoint as a run of that model writes it."""
    from unittest import mock

    from mncloud.train import CheckpointManager

    demo = _example()
    with mock.patch("sys.argv", ["train_fsdp.py", *argv]):
        model = demo.make_model(demo.parse_args())
    opt = torch.optim.AdamW(model.parameters())
    model(torch.zeros(2, 8, dtype=torch.long)).sum().backward()
    opt.step()
    with CheckpointManager(uri, async_upload=False) as ckpt:
        ckpt.save(step, {"model": model, "optimizer": opt})


def _files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


SMALL = ["--layers", "1", "--dim", "32", "--steps", "10", "--global-batch", "4"]
SIZED = ["--gpus-per-node", "4", "--nodes", "2"]


@pytest.fixture(scope="module")
def small_profile() -> Any:
    """`mncloud profile --json` of the example with SMALL on 2 nodes × 4 GPUs, run once (a
    process that imports torch and trains): the profile test reads its answer, the refused
    resume saves the profile it printed."""
    from mncloud.cli import app
    from tests.test_local import runner

    return runner.invoke(app, ["profile", str(EXAMPLE), *SIZED, "--json", "--", *SMALL])


@pytest.mark.slow
@pytest.mark.catalog
def test_a_resume_onto_another_model_is_refused_before_launch(small_profile: Any) -> None:
    """The script's profile says what it builds (dim 32); the checkpoint under the run's name
    was written by dim 16: `up --resume` names the first difference, exit 2, launches
    nothing, and leaves the checkpoint as it was."""
    from mncloud import layout
    from mncloud.cli import app
    from mncloud.plan.profile import StepProfile, save
    from tests.test_local import runner, state_of

    assert small_profile.exit_code == 0, small_profile.output
    save(StepProfile.model_validate(json.loads(small_profile.stdout)))  # run_profile's answer
    folder = layout.local_ckpt_dir("other")
    _save_checkpoint(folder.as_uri(), ["--layers", "1", "--dim", "16"])
    before = _files(folder)
    args = ["up", str(EXAMPLE), "--cloud", "local", "--gpus", "cpu:2", "--nodes", "2", "--name",
            "other", "--resume", "--yes", "--detach", "--", *SMALL]  # fmt: skip
    result = runner.invoke(app, args)
    assert result.exit_code == 2, result.output
    (line,) = result.output.strip().splitlines()
    assert line.startswith("error: checkpoint step 4 was written by a different model: "
                           "model.blocks.0.mlp.0.bias is 64 there, 128 in train_fsdp.py "
                           "(its profile);"), line  # fmt: skip
    assert "Traceback" not in result.output
    with pytest.raises(Exception):  # noqa: B017 - no run was recorded under the name
        state_of("other")
    assert _files(folder) == before
    # The same model resumes: the check lets it through (a dry run launches nothing).
    _save_checkpoint(folder.as_uri(), ["--layers", "1", "--dim", "32"], step=8)
    ok = runner.invoke(app, [*args[: -len(SMALL) - 1], "--dryrun", "--", *SMALL])
    assert ok.exit_code == 0, ok.output


def test_the_first_load_refuses_another_model_and_writes_nothing(tmp_path: Path) -> None:
    """Without a profile the script's model is known only once it is built: `load` compares
    it with the manifest's shapes before DCP reads a byte, and ends the process with exit 2
    (`ModelMismatch`), naming the tensor; the checkpoint is left as it was."""
    from mncloud.train import CheckpointManager, ModelMismatch

    uri = f"file://{tmp_path}/ckpt"
    _save_checkpoint(uri, ["--layers", "1", "--dim", "16"])
    before = _files(tmp_path / "ckpt")
    demo = _example()
    model = demo.TinyLM(128, 32, 1, 4, 32)
    state = {"model": model, "optimizer": torch.optim.AdamW(model.parameters())}
    ckpt = CheckpointManager(uri)
    with pytest.raises(ModelMismatch) as caught:
        ckpt.load(state)
    assert caught.value.code == 2
    assert str(caught.value).startswith("checkpoint step 4 was written by a different model: "
                                        "model.blocks.0.mlp.0.bias is 64 there, 128 in this "
                                        "script;")  # fmt: skip
    ckpt.close()
    assert _files(tmp_path / "ckpt") == before


@pytest.mark.slow
@pytest.mark.catalog
def test_a_refusal_at_the_first_load_ends_the_run_without_a_retry() -> None:
    """No profile, so `up --resume` launches; the script's first load refuses the checkpoint
    (another model). The node exits REFUSED_EXIT_CODE and the supervisor ends the run failed
    with the line at once, though `--max-restarts 2` would retry an error; nothing written."""
    from mncloud import layout
    from mncloud.backends.base import Failure, RunState
    from mncloud.backends.local import LocalBackend
    from tests.test_local import run_log, up, wait_final

    folder = layout.local_ckpt_dir("refused")
    _save_checkpoint(folder.as_uri(), ["--layers", "1", "--dim", "16"])
    before = _files(folder)
    up("refused", EXAMPLE, "--gpus", "cpu:1", "--max-restarts", "2", "--resume",
       script_args=["--layers", "1", "--dim", "32", "--steps", "2"])  # fmt: skip
    state = wait_final("refused")
    assert state.state is RunState.FAILED and state.refused, run_log("refused")
    assert (state.attempt, state.restarts, state.errors_retried) == (1, 0, 0)
    line = "checkpoint step 4 was written by a different model: model.blocks.0.mlp.0.bias"
    assert state.detail.startswith(f"failed: node 0: {line}"), state.detail
    assert state.detail.endswith("(refused: not retried)"), state.detail
    assert f"mncloud: refused (not retried): {line}" in run_log("refused")
    status = LocalBackend().status("refused")
    assert status.failure is Failure.REFUSED and line in status.detail
    assert _files(folder) == before


@pytest.mark.slow
def test_the_profile_of_a_sharded_script_reports_memory_per_gpu_sharded(small_profile: Any) -> None:
    """`mncloud profile` of the FSDP example learns from `parallelize` that it shards: on 2
    nodes × 4 GPUs each GPU holds an eighth of the weights, gradients and optimizer state
    (a node's quarter under hsdp), plus the activations; the same script run as ddp holds a
    whole replica; `--meta` counts the same."""
    from mncloud.cli import app
    from mncloud.plan.profile import StepProfile, find
    from tests.test_local import runner

    result = small_profile
    assert result.exit_code == 0, result.output
    fsdp = json.loads(result.stdout)
    state = fsdp["weight_bytes"] + fsdp["grad_bytes"] + fsdp["optimizer_bytes"]
    assert fsdp["parallel"] == "fsdp" and fsdp["grad_bytes"] == fsdp["weight_bytes"] > 0
    assert fsdp["memory_per_gpu_bytes"] == pytest.approx(state / 8 + fsdp["activation_bytes"])
    assert fsdp["memory_per_gpu"].startswith("fsdp: weights, gradients and optimizer state ÷ 8")
    hsdp = StepProfile.model_validate(fsdp).model_copy(update={"parallel": "hsdp"})
    need, how = hsdp.memory_per_gpu(gpus_per_node=4, nodes=2)
    assert need == pytest.approx(state / 4 + fsdp["activation_bytes"]) and "÷ 4 GPUs" in how

    ddp_args = [*SMALL, "--parallel", "ddp"]
    text = runner.invoke(app, ["profile", str(EXAMPLE), *SIZED, "--", *ddp_args]).output
    ddp, _ = find(EXAMPLE, ddp_args)
    assert ddp is not None and ddp.parallel == "ddp"
    whole = ddp.weight_bytes + ddp.grad_bytes + ddp.optimizer_bytes + ddp.activation_bytes
    shown = f"memory per GPU on 2 node(s) × 4 GPUs: {whole / 2**30:,.3g} GiB (ddp: a whole"
    assert shown in text, text

    # --meta (fake parameters: `model.to(device)` swaps them, the checkpoint's staging is not
    # warmed) counts the same model: the same work and state, sharded the same way.
    meta_run = runner.invoke(app, ["profile", "--meta", str(EXAMPLE), *SIZED, "--json", "--",
                                   *SMALL])  # fmt: skip
    assert meta_run.exit_code == 0, meta_run.output
    meta = json.loads(meta_run.stdout)
    assert meta["meta"] and meta["parallel"] == "fsdp"
    for key in ("flops_per_step", "weight_bytes", "grad_bytes", "optimizer_bytes"):
        assert meta[key] == fsdp[key], key
    assert meta["memory_per_gpu_bytes"] == pytest.approx(state / 8 + meta["activation_bytes"])


# --------------------------------------------------------------------------- slow


def _hash(tensors: dict[str, Any]) -> str:
    """The example's `weights_sha256` of a plain dict of tensors."""
    h = hashlib.sha256()
    for key in sorted(tensors):
        h.update(key.encode())
        h.update(tensors[key].detach().cpu().contiguous().float().numpy().tobytes())
    return h.hexdigest()


FLAGS = ["--gpus", "cpu:2", "--recovery-delay", "0.5s"]


STEPS, SAMPLES, EPOCH = 15, 120, 5
"""The reference runs' steps, on SAMPLES samples: a global batch of 24, 5 steps an epoch."""


def _train_args(parallel: str, steps: int = STEPS) -> list[str]:
    """The script's arguments of a run on 120 samples: with 15 steps, the tests below share
    one uninterrupted reference per layout (`tests/reference.py`)."""
    return ["--steps", str(steps), "--samples", str(SAMPLES), "--ckpt-interval", "5",
            "--parallel", parallel]  # fmt: skip


@pytest.mark.slow
@pytest.mark.catalog
def test_fsdp_preempted_once_ends_on_the_uninterrupted_weights(s3_env: Any, tmp_path: Path) -> None:
    from safetensors.torch import load_file

    from mncloud.backends.base import RunState
    from mncloud.backends.local.figures import read_final
    from mncloud.storage import CheckpointStore
    from tests.reference import reference_final
    from tests.test_local import cli, run_log, steps_since, up, wait_final, wait_until

    args = _train_args("fsdp")
    bucket = s3_env.make_bucket()
    up("fchaos", EXAMPLE, "--nodes", "2", *FLAGS, "--bucket", f"s3://{bucket}/x", script_args=args)
    store = CheckpointStore(f"s3://{bucket}/x/fchaos")

    def checkpoint_behind_training() -> bool:
        good, _ = store.candidates()
        return bool(good) and max(steps_since("fchaos", 0), default=0) > good[0] + 2

    wait_until(checkpoint_behind_training, 300, "a checkpoint, and steps past it")
    cli("chaos", "preempt", "fchaos", "--node", "1")
    state = wait_final("fchaos", timeout=400)
    assert state.state is RunState.SUCCEEDED, run_log("fchaos")
    assert state.preemptions == 1
    final = read_final(state.ckpt_uri)
    reference = reference_final(EXAMPLE, ["--nodes", "2", *FLAGS], args)  # after: no load
    assert reference["steps"] == STEPS
    assert final is not None and final["weights_sha256"] == reference["weights_sha256"]

    # Each rank wrote only its own shard: ≤ 0.6 × the model-and-optimizer bytes at world 4.
    manifest = store.read_manifest(STEPS)
    assert manifest.world_size == 4
    assert manifest.extra["mesh"] == {"shape": [4], "dims": ["shard"], "placements": ["S(0)"]}
    model = _example().make_model(_example_args())
    full = 3 * sum(p.numel() * p.element_size() for p in model.parameters())  # + AdamW's 2
    per_rank = manifest.extra["bytes_per_rank"]
    assert len(per_rank) == 4 and max(per_rank) <= 0.6 * full, (per_rank, full)

    # The export of the sharded checkpoint is the gathered model, bit for bit.
    out = tmp_path / "export"
    cli("export", "fchaos", "--out", str(out))
    assert _hash(load_file(out / "model.safetensors")) == final["weights_sha256"]


def _example_args() -> Any:
    import sys
    from unittest import mock

    with mock.patch.object(sys, "argv", ["train_fsdp.py"]):
        return _example().parse_args()


def _steps_trained(folder: Path) -> dict[int, list[int]]:
    """Step → the sample ids all ranks trained on in it, from every rank's log."""
    steps: dict[int, list[int]] = collections.defaultdict(list)
    for f in folder.glob("rank-*.jsonl"):
        for line in f.read_text().splitlines():
            record = json.loads(line)
            steps[record["step"]] += record["ids"]
    return steps


@pytest.mark.slow
@pytest.mark.catalog
@pytest.mark.parametrize("parallel", ["fsdp", "ddp"])
def test_resumed_on_3_nodes_then_1_every_sample_once_per_epoch(
    parallel: str, tmp_path: Path
) -> None:
    """Stopped at 2 nodes after step 4, resumed on 3 nodes to step 9, then on 1 to step 15:
    120 samples, a global batch of 24 (5 steps an epoch; each leg ends mid-epoch)."""
    from mncloud.backends.base import RunState
    from mncloud.backends.local.figures import read_final
    from tests.reference import reference_final
    from tests.test_local import run_log, up, wait_final

    samples = tmp_path / "samples"
    for nodes, steps in ((2, 4), (3, 9), (1, STEPS)):
        resume = ["--resume"] if nodes != 2 else []
        up("elastic", EXAMPLE, "--nodes", str(nodes), *FLAGS, *resume,
           script_args=[*_train_args(parallel, steps), "--sample-log", str(samples)])  # fmt: skip
        leg = wait_final("elastic", timeout=400)
        assert leg.state is RunState.SUCCEEDED, run_log("elastic")
        final = read_final(leg.ckpt_uri)
        assert final is not None and final["steps"] == steps
        assert final["world_size"] == 2 * nodes
    assert final is not None
    trained = _steps_trained(samples)
    assert sorted(trained) == list(range(1, STEPS + 1))
    for epoch in range(STEPS // EPOCH):
        first = EPOCH * epoch + 1
        ids = [i for step in range(first, first + EPOCH) for i in trained[step]]
        assert sorted(ids) == list(range(SAMPLES)), f"epoch {epoch}"
    reference = reference_final(EXAMPLE, ["--nodes", "2", *FLAGS], _train_args(parallel))
    assert abs(final["final_loss"] - reference["final_loss"]) <= 0.01 * reference["final_loss"]
    # The export of the last checkpoint (saved by 2 ranks) is the gathered model, bit for bit.
    from safetensors.torch import load_file

    from tests.test_local import cli

    cli("export", "elastic", "--out", str(tmp_path / "export"))
    assert _hash(load_file(tmp_path / "export" / "model.safetensors")) == final["weights_sha256"]


@pytest.mark.slow
@pytest.mark.catalog
def test_hsdp_on_2_nodes_resumes_on_3_resharded() -> None:
    """`--parallel hsdp`: a (2 nodes × 2) mesh, replicated across nodes and sharded inside;
    resumed with `--nodes 3` onto a (3 × 2) mesh, with the preflight's warning."""
    from mncloud.backends.base import RunState
    from mncloud.backends.local.figures import read_final
    from mncloud.storage import CheckpointStore
    from tests.test_local import run_log, up, wait_final

    common = ["--samples", "240", "--ckpt-interval", "3"]
    meshes = []
    for nodes, steps in ((2, 3), (3, 6)):
        resume = ["--resume"] if nodes == 3 else []
        up("hsdp", EXAMPLE, "--nodes", str(nodes), *FLAGS, "--parallel", "hsdp", *resume,
           script_args=["--steps", str(steps), *common])  # fmt: skip
        leg = wait_final("hsdp", timeout=400)
        assert leg.state is RunState.SUCCEEDED, run_log("hsdp")
        final = read_final(leg.ckpt_uri)
        assert final is not None and final["steps"] == steps
        meshes.append(CheckpointStore(leg.ckpt_uri).read_manifest(steps).extra["mesh"])
    assert meshes == [
        {"shape": [2, 2], "dims": ["replicate", "shard"], "placements": ["R", "S(0)"]},
        {"shape": [3, 2], "dims": ["replicate", "shard"], "placements": ["R", "S(0)"]},
    ]
    assert "saved sharded over 4 ranks (mesh 2 × 2); this run has 3 node(s) × 2 = 6" in run_log(
        "hsdp"
    )


@pytest.mark.slow
@pytest.mark.catalog
def test_fsdp_in_each_node_under_node_recovery_survives_a_lost_node() -> None:
    """`--recovery node`, 2 nodes × 2 processes: each node's replica is FSDP-sharded over its
    own 2 ranks and `Replicas` averages the local shards across nodes. Node 1 is preempted
    mid-run: node 0 trains on without a restart, node 1 is replaced alone, and both replicas
    end on the same weights."""
    from mncloud.backends.base import RunState
    from tests.test_local import cli, run_log, state_of, up, wait_final, wait_until
    from tests.test_node_recovery import events_of, steps_of

    flags = ["--nodes", "2", "--gpus", "cpu:2", "--recovery", "node", "--provision-delay", "2s"]
    # 300 ms a step or more (3 micro-batches of 100 ms, an idle wait): node 0 trains on alone
    # for 24 s or more, time for the replacement to boot cold (its host imports torch) and
    # heal mid-run, whatever else shares the cores: it healed at step 25 at load 7 (120 steps
    # left 95 after it); at load 14 it took 57 s, while node 0 stepped once a second.
    args = ["--steps", "90", "--ckpt-interval", "20", "--samples", "240", "--log-every", "20",
            "--compute-ms", "100"]  # fmt: skip
    up("fnode", EXAMPLE, *flags, script_args=args)
    wait_until(lambda: len(steps_of("fnode", 1)) >= 10, 300, "10 steps on node 1")
    cli("chaos", "preempt", "fnode", "--node", "1")
    killed_at = wait_until(lambda: [e.t for e in state_of("fnode").events
                                    if e.kind == "node-lost"], 60, "node-lost")[0]  # fmt: skip
    final = wait_final("fnode", 400)
    assert final.state is RunState.SUCCEEDED, run_log("fnode")
    assert (final.attempt, final.restarts, final.preemptions) == (1, 0, 1)
    assert len(events_of("fnode", "join", 0)) == 1  # the survivor was never restarted
    assert [s for t, s in steps_of("fnode", 0) if t > killed_at]  # and trained on alone
    # The replacement healed from node 0's sharded state mid-run and trained beside it: the
    # equal weights below come from averaging the shards across nodes, not from a late copy.
    healed = [h for h in events_of("fnode", "heal", 1) if h["t"] > killed_at]
    assert healed and healed[0]["step"] < 90, healed
    done = {r["node"]: r for r in events_of("fnode", "done")}
    assert sorted(done) == [0, 1] and {d["steps"] for d in done.values()} == {90}
    assert len({d["weights_sha256"] for d in done.values()}) == 1  # the same replica, twice
