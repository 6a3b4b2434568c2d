"""Cost to finish (#34): the script's profile, the step-time model, planning in steps, GPU
alternatives and the memory check. Real torch counting, real subprocess profiles, SkyPilot's
catalog snapshot and its schema and dry run."""

from __future__ import annotations

import copy
import itertools
import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from typer.testing import CliRunner

from mncloud.cli import app
from mncloud.errors import CatalogError, SpecError
from mncloud.plan import PlanRequest, hardware, make_plan
from mncloud.plan.stepmodel import Bound, Workload, step_time
from mncloud.spec import Accelerator
from mncloud.train.profiler import StepCounter, fake_parameters, state_bytes
from tests.skyseed import sky_enabled_clouds  # noqa: F401 - a fixture

EXAMPLE = Path(__file__).parent.parent / "examples" / "train_ddp.py"
runner = CliRunner()


# ------------------------------------------------------------------------- the step-time model


def test_stepmodel_worked_example() -> None:
    """The docstring's example, figure by figure."""
    work = Workload(flops_per_step=6 * 1.3e9 * 8192, ops_per_step=1000, grad_bytes=1.3e9 * 4)
    h100, p5 = hardware.gpu("H100"), hardware.network("aws", "p5.48xlarge")
    assert h100 is not None and p5.fabric.key == "efa" and p5.cards == 32
    fast = step_time(
        work, h100, gpus_per_node=8, nodes=4, inter_busbw_gbs=p5.busbw_gbs(enabled=True, nodes=4)
    )
    assert fast.compute_seconds == pytest.approx(0.0100 + 0.1576 + 0.0031, abs=1e-4)
    assert fast.mfu == 0.41 and "llm-foundry" in fast.mfu_source
    assert fast.intra_busbw_gbs == pytest.approx(346.5)
    assert fast.inter_busbw_gbs == pytest.approx(286.0)
    assert fast.comm_seconds == pytest.approx(0.0263 + 0.0273, abs=1e-4)
    assert fast.exposed_comm_seconds == 0
    assert fast.step_seconds == pytest.approx(0.1707, abs=1e-4)
    assert fast.bound is Bound.COMPUTE
    slow = step_time(
        work, h100, gpus_per_node=8, nodes=4, inter_busbw_gbs=p5.busbw_gbs(enabled=False, nodes=4)
    )
    assert slow.inter_busbw_gbs == pytest.approx(1.5)
    assert slow.step_seconds == pytest.approx(5.30, abs=0.01)
    assert slow.bound is Bound.NETWORK


def test_one_gpu_has_no_all_reduce_and_a100_is_slower_by_the_published_efficiencies() -> None:
    work = Workload(flops_per_step=1e15, grad_bytes=4e9)
    h100, a100 = hardware.gpu("H100"), hardware.gpu("A100-80GB")
    assert h100 is not None and a100 is not None
    one = step_time(work, h100, gpus_per_node=1, nodes=1, inter_busbw_gbs=None)
    assert one.comm_seconds == 0 and one.step_seconds == one.compute_seconds
    other = step_time(work, a100, gpus_per_node=1, nodes=1, inter_busbw_gbs=None)
    # 989 × 0.41 over 312 × 0.55 (the optimizer's memory pass aside): not 989 / 312 = 3.17
    assert 1.9 < other.step_seconds / one.step_seconds < 2.6


def test_every_data_row_names_its_source() -> None:
    facts = hardware.facts()
    rows: list[Any] = [*facts.gpus.values(), *facts.fabrics.values(), *facts.instances]
    assert rows and all(row.source.strip() for row in rows)
    assert hardware.gpu("H100", "lambda", "gpu_1x_h100_pcie").variant.startswith("H100 PCIe")


# ------------------------------------------------------------------------------ the profile


def _count(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> dict[str, Any]:
    opt = torch.optim.AdamW(model.parameters())
    state = {"model": model, "optimizer": opt}
    counter = StepCounter(state)
    loss = nn.functional.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    return {**counter.close(), **state_bytes(state)}


@pytest.mark.slow
def test_mlp_flops_and_bytes_match_the_analytic_count() -> None:
    batch, dims = 32, [64, 256, 256, 10]
    layers: list[nn.Module] = []
    for a, b in itertools.pairwise(dims):
        layers += [nn.Linear(a, b), nn.GELU()]
    model = nn.Sequential(*layers[:-1])
    counts = _count(model, torch.randn(batch, dims[0]), torch.randint(0, 10, (batch,)))
    macs = sum(a * b for a, b in itertools.pairwise(dims))
    # forward 2·B·macs, weight gradients the same, input gradients for all but the first layer
    analytic = 2 * batch * macs * 2 + 2 * batch * (macs - dims[0] * dims[1])
    assert counts["flops_per_step"] == pytest.approx(analytic, rel=0.02)
    params = sum(a * b + b for a, b in itertools.pairwise(dims))
    assert counts["params"] == params
    assert counts["grad_bytes"] == counts["weight_bytes"] == 4 * params
    assert counts["optimizer_bytes"] == 8 * params + 4 * len(list(model.parameters()))
    assert counts["ops_per_step"] > 0 and counts["activation_bytes"] > 0


class _Block(nn.Module):
    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.heads, self.qkv, self.out = heads, nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.up, self.down = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, d = x.shape
        q, k, v = self.qkv(x).view(b, s, 3, self.heads, d // self.heads).unbind(2)
        att = nn.functional.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True
        )
        x = x + self.out(att.transpose(1, 2).reshape(b, s, d))
        return x + self.down(nn.functional.gelu(self.up(x)))


class _Transformer(nn.Module):
    def __init__(self, vocab: int, d: int, layers: int, heads: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.blocks = nn.Sequential(*[_Block(d, heads) for _ in range(layers)])
        self.head = nn.Linear(d, vocab, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.blocks(self.embed(tokens))).flatten(0, 1)


def test_transformer_flops_match_the_analytic_count() -> None:
    vocab, d, layers, heads, batch, seq = 512, 128, 2, 4, 4, 64
    model = _Transformer(vocab, d, layers, heads)
    tokens = torch.randint(0, vocab, (batch, seq))
    counts = _count(model, tokens, torch.randint(0, vocab, (batch * seq,)))
    n = batch * seq
    per_block = d * 3 * d + d * d + d * 4 * d + 4 * d * d  # MACs per token in the linears
    linear = layers * per_block + d * vocab
    attention = layers * 2 * seq * d  # QKᵀ and AV, MACs per token (SDPA counts the full square)
    # forward 2·n·MACs; backward twice that (the embedding's input needs no gradient)
    analytic = 3 * 2 * n * (linear + attention)
    assert counts["flops_per_step"] == pytest.approx(analytic, rel=0.02)
    params = sum(p.numel() for p in model.parameters())
    assert counts["params"] == params and counts["grad_bytes"] == 4 * params


def test_meta_profile_of_a_model_larger_than_24_gb_counts_from_shapes() -> None:
    width, depth, batch = 16384, 24, 4
    with fake_parameters():
        model = nn.Sequential(*[nn.Linear(width, width, bias=False) for _ in range(depth)])
    params = depth * width * width
    assert 4 * params > 24e9  # fp32 weights alone are more than 24 GB
    counts = _count(model, torch.randn(batch, width), torch.randint(0, width, (batch,)))
    weights_grads = 2 * (2 * batch * params)
    inputs = 2 * batch * width * width * (depth - 1)
    assert counts["flops_per_step"] == weights_grads + inputs
    assert counts["params"] == params
    assert counts["grad_bytes"] == counts["weight_bytes"] == 4 * params
    assert counts["optimizer_bytes"] == 8 * params + 4 * depth


@pytest.mark.slow
def test_profile_cli_runs_the_example_and_plan_uses_it(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    shutil.copy(EXAMPLE, script)
    result = runner.invoke(app, ["profile", str(script), "--json", "--", "--hidden", "64"])
    assert result.exit_code == 0, result.output
    profile = json.loads(result.stdout)
    assert profile["samples_per_step"] == 32 and profile["steps_timed"] == 5
    assert profile["step_seconds"] > 0 and profile["device"] == "cpu"
    assert profile["params"] == 64 * 64 + 64 + 64 * 64 + 64 + 64 * 10 + 10
    plan = runner.invoke(
        app,
        [
            "plan",
            str(script),
            "--gpus",
            "H100:1,L4:1",
            "--steps",
            "100000",
            "--json",
            "--",
            "--hidden",
            "64",
        ],
    )
    assert plan.exit_code == 0, plan.output
    data = json.loads(plan.stdout)
    for c in data["candidates"]:
        assert c["step_seconds"] > 0 and c["compute_seconds"] > 0 and c["comm_seconds"] == 0
        assert c["expected_hours"] >= c["work_hours"] > 0
    assert all(e["reason"] for e in data["excluded"])
    # the script changed: the profile is stale, and --steps says what to run
    script.write_text(script.read_text() + "\n# edited\n")
    stale = runner.invoke(
        app, ["plan", str(script), "--gpus", "H100:1", "--steps", "10", "--", "--hidden", "64"]
    )
    assert stale.exit_code == 2
    assert "stale" in stale.stderr and "mncloud profile" in stale.stderr


@pytest.mark.slow
def test_profile_of_a_failing_script_says_its_last_error_line(tmp_path: Path) -> None:
    script = tmp_path / "bad.py"
    script.write_text("raise ValueError('no data at /nowhere')\n")
    result = runner.invoke(app, ["profile", str(script)])
    assert result.exit_code == 2
    assert result.stderr.strip() == (
        "error: profiling bad.py failed: ValueError: no data at /nowhere"
    )


# ---------------------------------------------------------------------------- the plan


def _request(gpus: str, work: Workload, **fields: Any) -> PlanRequest:
    first, *others = Accelerator.parse_list(gpus)
    return PlanRequest.build(
        accelerator=first, alternatives=others, workload=work, steps=100_000, **fields
    )


@pytest.mark.catalog
def test_compute_bound_job_ranks_h100_before_a_cheaper_hour_of_a100() -> None:
    work = Workload(flops_per_step=6 * 1.3e9 * 8192, ops_per_step=1000, grad_bytes=5.2e9)
    plan = make_plan(_request("H100:8,A100-80GB:8", work, spot="on-demand", clouds=["aws"]))
    assert plan.choice.accelerator == "H100:8"
    a100 = [c for c in plan.candidates if c.accelerator == "A100-80GB:8"]
    assert a100 and min(c.hourly_total for c in a100) < plan.choice.hourly_total
    assert all(c.expected_cost > plan.choice.expected_cost for c in a100)
    assert "cheaper per hour" in plan.explanation and "slower GPUs" in plan.explanation
    # --minimize time picks the fastest finish too
    fastest = make_plan(_request("H100:8,A100-80GB:8", work, minimize="time", clouds=["aws"]))
    assert fastest.choice.expected_hours == min(c.expected_hours for c in fastest.candidates)


@pytest.mark.catalog
def test_small_job_on_one_node_ranks_the_cheapest_hour_first() -> None:
    work = Workload(flops_per_step=1e8, ops_per_step=200, grad_bytes=1e6)
    plan = make_plan(_request("H100:1,L4:1,A10G:1", work, spot="on-demand"))
    assert plan.choice.accelerator != "H100:1"
    assert plan.choice.hourly_total == min(c.hourly_total for c in plan.candidates)
    assert plan.choice.bound is Bound.OVERHEAD


@pytest.mark.catalog
def test_an_offer_whose_gpu_cannot_hold_the_replica_is_excluded_with_its_reason() -> None:
    work = Workload(flops_per_step=1e15, weight_bytes=30e9, grad_bytes=30e9, optimizer_bytes=1e9)
    plan = make_plan(_request("L4:8,A100-80GB:8", work, spot="on-demand", parallel="ddp"))
    assert {c.accelerator for c in plan.candidates} == {"A100-80GB:8"}
    reasons = [e.reason for e in plan.excluded if "cannot hold" in e.reason]
    assert reasons and "g2-standard-96" in reasons[0] and "L4" in reasons[0]
    sharded = make_plan(_request("L4:8", work, spot="on-demand"))  # auto: FSDP over the 8 L4s
    assert sharded.choice.parallel is not None and sharded.choice.parallel.value == "fsdp"
    huge = work.model_copy(update={"optimizer_bytes": 600e9})
    with pytest.raises(CatalogError, match=r"it needs \d+ GPUs of 2\d GiB: --nodes \d"):
        make_plan(_request("L4:8", huge))


@pytest.mark.catalog
@pytest.mark.parametrize(
    ("gpus", "message"),
    [
        ("H100:8,", "item 2 is empty"),
        ("H100:8,A100:x", "is not a whole number"),
        ("H100:8,H10O:8", "did you mean"),
        ("H100:8,H100:8", "listed twice"),
    ],
)
def test_bad_gpu_lists_are_one_line_errors(gpus: str, message: str) -> None:
    with pytest.raises(SpecError, match=message):
        Accelerator.parse_list(gpus)
    result = runner.invoke(app, ["plan", "--gpus", gpus, "--hours", "5"])
    assert result.exit_code == 2 and message in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--steps", "0"], "--steps"),
        (["--steps", "2.5"], "--steps"),
        (["--minimize", "fast"], "--minimize 'fast': give cost or time"),
        (["--steps", "10"], "--steps needs the step's cost"),
        (["--params", "1e9"], "give --flops-per-step, or both --params and --tokens-per-step"),
    ],
)
def test_bad_planning_flags_are_one_line_errors(args: list[str], message: str) -> None:
    result = runner.invoke(app, ["plan", "--gpus", "H100:8", *args])
    assert result.exit_code == 2, result.output
    assert message in result.stderr


# ---------------------------------------------------------------------- render and dry run


@pytest.mark.slow
@pytest.mark.catalog
@pytest.mark.skipif(shutil.which("rsync") is None, reason="SkyPilot's dry run needs rsync on PATH")
def test_gpu_alternatives_render_ordered_entries_skypilot_accepts(
    tmp_path: Path,
    sky_enabled_clouds: list[str],  # noqa: F811 - the fixture imported above
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import sky
    import sky.jobs
    from sky.utils import common_utils, schemas

    from mncloud.backends.base import LaunchRequest
    from mncloud.backends.skypilot import SkyPilotBackend
    from mncloud.launch import plan_request
    from mncloud.render import render
    from mncloud.request import build_spec
    from mncloud.spec.launch import LaunchOptions

    def forbidden(*_args: Any, **_kwargs: Any) -> None:
        raise AssertionError("a dry run must not provision")

    monkeypatch.setattr(sky, "launch", forbidden)
    monkeypatch.setattr(sky.jobs, "launch", forbidden)
    (tmp_path / "pyproject.toml").write_text("[project]\nname='p'\n")
    script = tmp_path / "train.py"
    script.write_text("print('hi')\n")
    spec = build_spec(
        script, gpus="A100-80GB:8,H100:8", nodes=2, spot=False, cloud=["gcp"], name="alt"
    )
    options = LaunchOptions(steps=20_000, params=1.3e9, flops_per_step=6.4e13)
    plan = make_plan(plan_request(spec, options))
    types = [e["accelerators"] for e in plan.ordered_resources()]
    assert types[0] == "H100:8" and "A100-80GB:8" in types  # our ranking, not the list order
    task = render(spec, plan=plan)
    public = {k: v for k, v in copy.deepcopy(task.config).items() if not k.startswith("_")}
    common_utils.validate_schema(public, schemas.get_task_schema(), "")
    parsed = sky.Task.from_yaml_config(copy.deepcopy(task.config))
    assert {str(r.accelerators) for r in parsed.resources} >= {"{'H100': 8}", "{'A100-80GB': 8}"}
    request = LaunchRequest(spec=spec, task=task, plan=plan, dryrun=True)
    status = SkyPilotBackend().launch(request)
    assert "dry run passed" in status.detail
    assert status.instance_type == plan.choice.instance_type == "a3-highgpu-8g"


@pytest.mark.catalog
def test_communication_bound_job_ranks_a_fast_fabric_first_compute_bound_by_price() -> None:
    """4 × H100:8 on-demand: Lambda's hour is cheapest but its nodes talk over plain TCP."""
    chatty = Workload(flops_per_step=1e13, grad_bytes=5.2e9)  # 1.3B fp32 gradients
    plan = make_plan(
        PlanRequest.build(
            accelerator=Accelerator.parse("H100:8"),
            nodes=4,
            spot="on-demand",
            workload=chatty,
            steps=20_000,
        )
    )
    # a fabric, not TCP (AWS EFA counts one card of a p5's 32 unless SkyPilot's config has
    # aws.use_internal_ips: GCP's TCPX then beats it)
    assert plan.choice.network.startswith(("GCP GPUDirect-TCPX", "AWS EFA"))
    cheapest_hour = min(plan.candidates, key=lambda c: c.hourly_total)
    assert cheapest_hour.cloud == "lambda" and cheapest_hour.bound is Bound.NETWORK
    assert "the network decided" in plan.explanation
    quiet = Workload(flops_per_step=6.4e13, grad_bytes=4e6)
    plan = make_plan(
        PlanRequest.build(
            accelerator=Accelerator.parse("H100:8"),
            nodes=4,
            spot="on-demand",
            workload=quiet,
            steps=20_000,
        )
    )
    assert plan.choice.hourly_total == min(c.hourly_total for c in plan.candidates)


@pytest.mark.catalog
def test_gpu_alternatives_without_a_plan_render_a_list_or_cross_the_clouds(tmp_path: Path) -> None:
    from mncloud.render import render
    from mncloud.request import build_spec

    (tmp_path / "pyproject.toml").write_text("[project]\nname='p'\n")
    script = tmp_path / "train.py"
    script.write_text("print('hi')\n")
    spec = build_spec(script, gpus="H100:8,A100-80GB:8", nodes=2, name="alt")
    resources = render(spec).config["resources"]  # render checks SkyPilot's schema itself
    assert resources["accelerators"] == ["H100:8", "A100-80GB:8"]
    spec = build_spec(script, gpus="H100:8,A100-80GB:8", nodes=2, name="alt", cloud=["aws", "gcp"])
    resources = render(spec).config["resources"]
    assert "accelerators" not in resources
    pairs = {(e["infra"], e["accelerators"]) for e in resources["any_of"]}
    assert pairs == {(f"{c}/*", a) for c in ("aws", "gcp") for a in ("H100:8", "A100-80GB:8")}


@pytest.mark.catalog
def test_gpu_alternatives_on_the_local_backend_are_refused(tmp_path: Path) -> None:
    (tmp_path / "pyproject.toml").write_text("[project]\nname='p'\n")
    (tmp_path / "train.py").write_text("print('hi')\n")
    result = runner.invoke(
        app, ["up", str(tmp_path / "train.py"), "--gpus", "H100:8,A100:8", "--cloud", "local"]
    )
    assert result.exit_code == 2
    assert "several GPU types is for clouds" in result.stderr


def _chatty_plan(**fields: Any) -> Any:
    fields.setdefault("workload", Workload(flops_per_step=1e13, grad_bytes=5.2e9))
    return make_plan(
        PlanRequest.build(
            accelerator=Accelerator.parse("H100:8"),
            nodes=4,
            spot="on-demand",
            clouds=["aws"],
            steps=20_000,
            **fields,
        )
    )


@pytest.mark.catalog
def test_efa_is_priced_at_the_cards_skypilot_will_attach(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    one_card = _chatty_plan()
    assert "1 of 32 EFA cards" in one_card.choice.network
    config = tmp_path / "config.yaml"
    config.write_text("aws:\n  use_internal_ips: true\n")
    monkeypatch.setenv("SKYPILOT_GLOBAL_CONFIG", str(config))
    all_cards = _chatty_plan()
    assert "EFA cards" not in all_cards.choice.network
    assert all_cards.choice.step_seconds < one_card.choice.step_seconds
    standard = _chatty_plan(network="standard")
    assert standard.choice.network.startswith("TCP (AWS EFA: --network standard)")
    assert standard.choice.step_seconds > one_card.choice.step_seconds


@pytest.mark.catalog
def test_learn_takes_measured_bandwidth_and_efficiency_from_earlier_runs() -> None:
    from mncloud.plan import learned
    from mncloud.records.ledger import observed_runs
    from mncloud.records.model import RunRecord

    def record(run_id: str, created: float, step: float | None, busbw: float | None) -> Any:
        return RunRecord(
            run_id=run_id, name="llm", user="u", host="h", created_at=created,
            backend="skypilot", nodes=4, task_yaml="",
            spec={"script": "/p/train.py", "script_args": ["--big"]},
            plan={"choice": {"cloud": "aws", "instance_type": "p5.48xlarge",
                             "accelerator": "H100:8"}},
            step_times={0: step, 1: step} if step else {},
            bandwidth={"busbw_gbs": busbw} if busbw else None,
        )  # fmt: skip

    runs = observed_runs(
        [record("a", 1.0, 0.5, 3.0), record("b", 2.0, None, 5.0), record("c", 3.0, 0.4, None)]
    )
    assert [r.created_at for r in runs] == [3.0, 2.0, 1.0]
    busbw = learned.node_busbw(runs)
    # The newest, one rank per node × 8 rails, measured on 4 nodes: kept as at 8 (EFA 0.715 →
    # 0.6 of its rate), given back at 4.
    assert busbw == {"aws/p5.48xlarge": pytest.approx(5.0 * 8 * 0.6 / 0.715)}
    assert learned.at_nodes(busbw["aws/p5.48xlarge"], "aws", "p5.48xlarge", 4) == pytest.approx(40)
    work = Workload(flops_per_step=6.4e13, grad_bytes=5.2e9)
    mfu = learned.mfu_by_gpu(work, runs, "/p/train.py", ["--big"])
    assert set(mfu) == {"H100"} and 0 < mfu["H100"] < 0.4
    assert learned.mfu_by_gpu(work, runs, "/p/other.py", []) == {}
    plan = _chatty_plan(workload=work.model_copy(update={"mfu_by_gpu": mfu}), measured_busbw=busbw)
    p5 = next(c for c in plan.candidates if c.instance_type == "p5.48xlarge")
    assert "measured 40 GB/s" in p5.network  # the plan's 4 nodes, as measured


@pytest.mark.catalog
def test_a_bandwidth_measured_on_2_nodes_is_rescaled_to_the_plans_node_count() -> None:
    """EFA between 2 nodes reaches 0.83 of its rate, from 8 on 0.6: a 2-node preflight's
    figure does not promise a 16-node run the same (nor 2 nodes a 16-node figure's)."""
    from mncloud.plan import learned
    from mncloud.records.ledger import observed_runs
    from mncloud.records.model import RunRecord

    two = RunRecord(
        run_id="a", name="llm", user="u", host="h", created_at=1.0, backend="skypilot",
        nodes=2, task_yaml="", spec={"script": "/p/train.py"},
        plan={"choice": {"cloud": "aws", "instance_type": "p5.48xlarge",
                         "accelerator": "H100:8"}},
        bandwidth={"busbw_gbs": 5.0},
    )  # fmt: skip
    busbw = learned.node_busbw(observed_runs([two]))
    assert busbw["aws/p5.48xlarge"] == pytest.approx(40 * 0.6 / 0.83)
    work = Workload(flops_per_step=1e13, grad_bytes=5.2e9)
    wide = make_plan(
        PlanRequest.build(
            accelerator=Accelerator.parse("H100:8"), nodes=16, spot="on-demand",
            clouds=["aws"], steps=20_000, workload=work, measured_busbw=busbw,
        )
    )  # fmt: skip
    p5 = next(c for c in wide.candidates if c.instance_type == "p5.48xlarge")
    assert f"measured {40 * 0.6 / 0.83:.3g} GB/s" in p5.network
    four = _chatty_plan(workload=work, measured_busbw=busbw)  # 4 nodes: between the two
    p5 = next(c for c in four.candidates if c.instance_type == "p5.48xlarge")
    assert f"measured {40 * 0.715 / 0.83:.3g} GB/s" in p5.network
