"""Node recovery (`--recovery node`): one lost node is replaced alone; the others train on.

End to end on the local backend with real torchrun, a real torchft lighthouse and real
SIGKILLs: 3 nodes × 2 processes of `examples/train_ddp.py`. The fast tests cover the request's
rules, the rendered run script and the supervisor's choice between one node and the gang.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from mncloud import constants
from mncloud.backends.base import RunState
from mncloud.backends.local.replacing import NodeReplacer
from mncloud.backends.local.state import LocalLaunch, LocalState, NodeRecord, series_uri
from mncloud.errors import SpecError
from mncloud.layout import run_dir
from mncloud.records.store import load_current
from mncloud.request import build_spec
from mncloud.spec import Recovery, min_replicas
from mncloud.telemetry.series import Series
from mncloud.telemetry.seriestail import SeriesTail
from tests.test_local import EXAMPLE, cli, run_log, runner, state_of, up, wait_final, wait_until

pytestmark = pytest.mark.catalog

NODES = ["--nodes", "3", "--gpus", "cpu:2", "--recovery", "node", "--provision-delay", "2s"]
# Provisioning long enough that survivors waiting on the lost node (not going on) would show.
SLOW_NODES = [*NODES[:-1], "8s"]
# Long enough that the replacement (8 s + a cold start of ~15 s on 2 cores) joins mid-run:
# lost at ~step 130, it joined at step 1100 on 2 busy cores (load 6).
STEPS = 2000
TRAIN = ["--steps", str(STEPS), "--ckpt-interval", "50", "--log-every", "500"]
# Test 2's survivors step at >= 30 ms (`--compute-ms`, an idle wait): they leave the cores to
# the replacements' cold starts. (Not test 1's: paced to 800 steps, its replacement, 55 s cold
# at load 14, joined after the survivors ended; a fixed step count cannot end at the join.)
PACE = ["--compute-ms", "30"]


_read: dict[str, tuple[SeriesTail, Series]] = {}


def telemetry(name: str) -> Series:
    """Everything the run's ranks wrote to its telemetry segments so far (read incrementally:
    the tests poll it every few milliseconds)."""
    uri = series_uri(run_dir(name))
    assert uri is not None
    tail, seen = _read.setdefault(uri, (SeriesTail(uri), Series()))
    new = tail.read()
    seen.steps += new.steps
    seen.events += new.events
    return seen


def events_of(name: str, kind: str, node: int | None = None) -> list[dict[str, Any]]:
    """The replicas' events of `kind` (of `node`), each as its fields with `t` and `node`."""
    return [{**e.data, "t": e.t, "node": e.node} for e in telemetry(name).events
            if e.event == kind and node in (None, e.node)]  # fmt: skip


def steps_of(name: str, node: int) -> list[tuple[float, int]]:
    """(time, step) of each step `node`'s rank 0 finished, once per process."""
    rows = [r for r in telemetry(name).steps if r.rank == 0 and r.node == node]
    first = {(r.launch, r.step): r.t for r in reversed(rows)}
    return sorted((t, step) for (_, step), t in first.items())


def all_three_stepping(name: str) -> bool:
    """Every node stepped 20 times since the last quorum change: a loss now is one mid-run,
    not one during a late joiner's heal (that case has its own test below)."""
    changes = [r["t"] for r in events_of(name, "quorum")]
    since = max(changes, default=0.0)
    return all(len([t for t, _ in steps_of(name, n) if t > since]) >= 20 for n in range(3))


# --------------------------------------------------------------------------- fast


def test_recovery_defaults_to_node_for_scripts_that_opt_in(tmp_path: Path) -> None:
    plain = tmp_path / "plain.py"
    plain.write_text("print('hi')\n")
    (tmp_path / "pyproject.toml").write_text("[project]\nname='x'\n")
    kw: dict[str, Any] = {"gpus": "cpu:2", "cloud": ["local"]}
    assert build_spec(EXAMPLE, nodes=3, **kw).recovery is Recovery.NODE
    assert build_spec(EXAMPLE, nodes=1, **kw).recovery is Recovery.GANG
    assert build_spec(EXAMPLE, nodes=3, recovery="gang", **kw).recovery is Recovery.GANG
    assert build_spec(plain, nodes=3, **kw).recovery is Recovery.GANG
    assert build_spec(EXAMPLE, nodes=3, launcher="none", **kw).recovery is Recovery.GANG


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--recovery", "elastic"], "--recovery 'elastic' is unknown; choose gang or node"),
        (["--recovery", "node", "--nodes", "1"], "--recovery node needs --nodes 2 or more"),
        (["--recovery", "node", "--launcher", "none"], "works with --launcher torchrun only"),
        (["--provision-delay", "-3s"], "--provision-delay '-3s': write a duration"),
        (["--provision-delay", "soon"], "--provision-delay 'soon': write a duration"),
    ],
)
def test_bad_recovery_options_are_one_line(flags: list[str], message: str) -> None:
    args = ["up", str(EXAMPLE), "--cloud", "local", "--gpus", "cpu:1", "--nodes", "2", *flags]
    result = runner.invoke(app_of(), [*args, "--yes", "--dryrun"])
    assert result.exit_code == 2, result.output
    assert message in result.output and "Traceback" not in result.output
    assert len(result.output.strip().splitlines()) == 1


def test_node_recovery_of_a_script_that_does_not_opt_in_is_refused(tmp_path: Path) -> None:
    (tmp_path / "pyproject.toml").write_text("[project]\nname='x'\n")
    script = tmp_path / "plain.py"
    script.write_text("print('hi')\n")
    with pytest.raises(SpecError, match=r"plain.py does not use mncloud.train.Replicas"):
        build_spec(script, gpus="cpu:1", nodes=2, cloud=["local"], recovery="node")


def test_rendered_run_starts_one_replica_group_per_node() -> None:
    result = cli("render", str(EXAMPLE), "--cloud", "local", "--gpus", "cpu:2", "--nodes", "3")
    text = result.output
    assert "--standalone" in text and "--rdzv_backend=static" not in text
    assert f"{constants.RECOVERY_ENV}: node" in text
    assert (
        f"{constants.NUM_REPLICAS_ENV}: '3'" in text or f'{constants.NUM_REPLICAS_ENV}: "3"' in text
    )
    gang = cli("render", str(EXAMPLE), "--cloud", "local", "--gpus", "cpu:2", "--nodes", "3",
               "--recovery", "gang").output  # fmt: skip
    assert "--rdzv_backend=static" in gang and constants.RECOVERY_ENV not in gang


def _replacer(tmp_path: Path, nodes: int) -> tuple[NodeReplacer, list[tuple[str, int | None]]]:
    launch = LocalLaunch(
        name="r", token="tok", task_id="t", num_nodes=nodes, procs_per_node=1, master_port=1,
        ckpt_uri="file:///x", workdir=str(tmp_path), run="true", recovery="node",
        min_replicas=min_replicas(nodes), recovery_delay=5.0,
    )  # fmt: skip
    state = LocalState(
        name="r", token="tok", task_id="t", num_nodes=nodes, procs_per_node=1, master_port=1,
        ckpt_uri="file:///x", nodes=[NodeRecord(node=n) for n in range(nodes)],
    )  # fmt: skip
    seen: list[tuple[str, int | None]] = []
    replacer = NodeReplacer(
        tmp_path,
        launch,
        state,
        lambda kind, message, node=None, **_: seen.append((kind, node)),
        lambda node: None,  # type: ignore[arg-type,return-value]
    )
    return replacer, seen


def test_one_loss_is_replaced_alone_after_the_provisioning_delay(tmp_path: Path) -> None:
    replacer, seen = _replacer(tmp_path, 3)
    codes = replacer.take_losses({0: None, 1: -9, 2: None}, set(), now=100.0)
    assert codes == {0: None, 1: None, 2: None} and seen == [("node-lost", 1)]
    assert replacer.state.nodes[1].status == "replacing" and replacer.state.preemptions == 1
    assert replacer.due(104.9) == [] and replacer.due(105.0) == [1]
    assert replacer.state.nodes[1].status == "healing"
    # An error in the user's code (exit 1) is not a preemption: the supervisor's to handle.
    assert replacer.take_losses({0: 1, 1: None, 2: None}, set(), now=106.0)[0] == 1


def test_too_many_lost_at_once_goes_back_to_the_gang(tmp_path: Path) -> None:
    replacer, seen = _replacer(tmp_path, 3)
    codes = {0: None, 1: -9, 2: -9}
    assert replacer.take_losses(codes, set(), now=1.0) == codes and seen == []
    # One after the other: the second loss leaves 1 < 2 alive, so the gang is relaunched.
    replacer.take_losses({0: None, 1: -9, 2: None}, set(), now=1.0)
    assert replacer.take_losses({0: None, 1: -9, 2: -9}, set(), now=2.0)[2] == -9


def app_of() -> Any:
    from mncloud.cli import app

    return app


# --------------------------------------------------------------------------- slow, end to end


@pytest.mark.slow
def test_lost_node_is_replaced_alone_and_heals_from_a_live_peer() -> None:
    """SIGKILL node 1 mid-run: nodes 0 and 2 keep their processes and keep stepping, node 1 is
    relaunched alone, joins and heals; every replica ends with the same bits."""
    up("ft", EXAMPLE, *SLOW_NODES, script_args=TRAIN)
    wait_until(lambda: len(steps_of("ft", 0)) >= 100, 180, "100 steps on node 0")
    wait_until(lambda: all_three_stepping("ft"), 60, "a quorum of all three, stepping")
    before = state_of("ft")
    survivors = {n: set(before.nodes[n].pids) for n in (0, 2)}
    assert all(len(p) >= 4 for p in survivors.values()), survivors  # bash, torchrun, 2 workers
    cli("chaos", "preempt", "ft", "--node", "1")
    killed_at = wait_until(lambda: [e.t for e in state_of("ft").events if e.kind == "node-lost"],
                           30, "node-lost")[0]  # fmt: skip
    wait_until(
        lambda: (
            events_of("ft", "heal", 1)
            and [h for h in events_of("ft", "heal", 1) if h["t"] > killed_at]
        ),
        180,
        "node 1 to heal",
    )
    during = state_of("ft")
    for n, pids in survivors.items():
        assert pids <= set(during.nodes[n].pids), f"node {n} was restarted"
    final = wait_final("ft", 300)
    assert final.state is RunState.SUCCEEDED, run_log("ft")
    assert (final.attempt, final.restarts, final.preemptions) == (1, 0, 1)

    healed = next(h for h in events_of("ft", "heal", 1) if h["t"] > killed_at)
    joins = {n: len(events_of("ft", "join", n)) for n in range(3)}
    assert joins == {0: 1, 1: 2, 2: 1}  # survivors joined once: never restarted
    # Survivors stepped while node 1 was gone, before its replacement even started: they
    # never wait for it (nor for each other's collective timeout).
    replaced_at = next(e.t for e in state_of("ft").events if e.kind == "node-start")
    for n in (0, 2):
        outage = [s for t, s in steps_of("ft", n) if killed_at < t < healed["t"]]
        assert len(outage) >= 5 and outage == sorted(outage), (n, outage)
        assert len([t for t, _ in steps_of("ft", n) if killed_at < t < replaced_at]) >= 5
        retries = [r for r in events_of("ft", "retry", n) if r["t"] > killed_at]
        assert len(retries) <= 1, retries  # at most the step in flight is redone
    # Node 1 took a step from a peer that is ahead of anything it had, then trained on.
    assert healed["step"] > healed["from_step"] and max(s for _, s in steps_of("ft", 1)) == STEPS
    done = {r["node"]: r for r in events_of("ft", "done")}
    assert sorted(done) == [0, 1, 2] and {d["steps"] for d in done.values()} == {STEPS}
    assert len({d["weights_sha256"] for d in done.values()}) == 1  # bitwise equal replicas

    kinds = [e.kind for e in state_of("ft").events]
    assert kinds.count("node-lost") == 1 and kinds.count("node-start") == 1
    assert kinds.count("node-joined") == 1 and "launch" in kinds
    record_kinds = [e.kind for e in load_current("ft").events]
    for kind in ("node-lost", "node-joined", "node-healed"):
        assert kind in record_kinds, record_kinds
    from mncloud.backends.local.figures import recovery_figures
    from mncloud.cli.follow import node_recovery_line

    figures = recovery_figures(run_dir("ft"))
    assert figures.node_losses == 1 and len(figures.heal_s) >= 1
    assert sorted(figures.replica_weights) == [0, 1, 2]
    assert "every replica's final weights equal" in node_recovery_line(figures)
    status = json.loads(cli("status", "ft", "--json").output)[0]
    assert status["recovery"] == "node" and set(status["node_states"].values()) == {"finished"}
    assert status["quorum"] == [0, 1, 2]


@pytest.mark.slow
def test_a_replacement_lost_as_it_joins_does_not_hold_the_survivors() -> None:
    """Node 1's replacement is killed the moment it joins (before its first quorum, or while
    the group that includes it is being made): the survivors give up on it (within
    `CONFIGURE_TIMEOUT_S` at worst) and go on as two, before the second replacement joins.
    The second replacement is held frozen from its start (a VM slow to boot) until they have
    gone on: the window ends at that event, not at a provisioning delay sized past the
    configure timeout (held by the lost one, they would never step and the wait fails)."""
    from mncloud.train.ft import CONFIGURE_TIMEOUT_S

    up("rj", EXAMPLE, *NODES, script_args=["--steps", "6000", "--ckpt-interval", "100", *PACE])
    wait_until(lambda: all_three_stepping("rj"), 180, "a quorum of all three, stepping")
    cli("chaos", "preempt", "rj", "--node", "1")
    lost_at = wait_until(
        lambda: [e.t for e in state_of("rj").events if e.kind == "node-lost"], 30, "node-lost"
    )[0]
    deadline = time.monotonic() + 300
    while not [r for r in events_of("rj", "join", 1) if r["t"] > lost_at]:
        assert time.monotonic() < deadline, "node 1's replacement never joined"
        time.sleep(0.01)
    cli("chaos", "preempt", "rj", "--node", "1")
    second = wait_until(lambda: node_events("rj", "node-lost")[1:], 30, "second node-lost")[0]
    deadline = time.monotonic() + 60
    while not node_events("rj", "node-start")[1:]:  # poll fast: freeze it as it starts
        assert time.monotonic() < deadline, "no second replacement"
        time.sleep(0.01)
    restarted = node_events("rj", "node-start")[1]
    with frozen(state_of("rj").token, 1):
        wait_until(
            lambda: all(len([t for t, _ in steps_of("rj", n) if t > second]) >= 5 for n in (0, 2)),
            CONFIGURE_TIMEOUT_S + 120,
            "the survivors to go on as two",
        )
    # Until the second replacement joins the survivors can only have stepped as two: held by
    # the lost one, they would show none.
    rejoined = wait_until(
        lambda: [r["t"] for r in events_of("rj", "join", 1) if r["t"] > restarted], 300, "rejoin"
    )[0]
    for n in (0, 2):
        went_on = [s for t, s in steps_of("rj", n) if second < t < rejoined]
        assert len(went_on) >= 5 and went_on == sorted(went_on), (n, went_on)
    cli("down", "rj", "--now", "--yes")


@contextlib.contextmanager
def frozen(token: str, node: int) -> Iterator[None]:
    """Every process of `node` stopped (SIGSTOP) while the block runs, then resumed: a node
    that makes no progress. Rescans until no new process appears (one forked between a scan
    and its stop is caught by the next)."""
    import psutil

    from mncloud.backends.local.processes import tagged_processes

    stopped: dict[int, psutil.Process] = {}
    try:
        for _ in range(50):
            new = [p for p in tagged_processes(token, node) if p.pid not in stopped]
            if not new:
                break
            for proc in new:
                with contextlib.suppress(psutil.Error):
                    proc.suspend()
                    stopped[proc.pid] = proc
        yield
    finally:
        for proc in stopped.values():
            with contextlib.suppress(psutil.Error):
                proc.resume()


def node_events(name: str, kind: str) -> list[float]:
    return [e.t for e in state_of(name).events if e.kind == kind]


@pytest.mark.slow
def test_two_of_three_lost_at_once_relaunch_the_gang_from_the_bucket() -> None:
    # Two lost once a step is committed (step 50 or later); the gang, relaunched from the
    # bucket's newest step, trains to 200.
    from mncloud.storage import CheckpointStore

    up("ft2", EXAMPLE, *NODES, script_args=["--steps", "200", "--ckpt-interval", "50"])
    store = CheckpointStore(state_of("ft2").ckpt_uri)
    wait_until(lambda: store.candidates()[0], 180, "a committed checkpoint")
    cli("chaos", "preempt", "ft2", "--node", "1")
    cli("chaos", "preempt", "ft2", "--node", "2")
    final = wait_final("ft2", 300)
    assert final.state is RunState.SUCCEEDED, run_log("ft2")
    assert final.attempt == 2 and final.restarts == 1, run_log("ft2")
    preempted = [e for e in final.events if e.kind == "preempted"]
    assert preempted and preempted[0].data["latest_checkpoint"] >= 50
    starts = [r for r in events_of("ft2", "start") if r["t"] > preempted[0].t]
    assert {r["node"] for r in starts} == {0, 1, 2}
    assert {r["resumed_from"] for r in starts} == {preempted[0].data["latest_checkpoint"]}
    done = {r["node"]: r for r in events_of("ft2", "done")}
    assert sorted(done) == [0, 1, 2] and len({d["weights_sha256"] for d in done.values()}) == 1


@pytest.mark.slow
def test_heal_cut_off_mid_transfer_falls_back_to_the_bucket_and_never_half_loads() -> None:
    """2 nodes: node 1 is replaced; the moment it joins to heal from node 0 (the only peer),
    node 0 freezes (a partition) and then dies, so the heal is cut off before or during the
    transfer. Node 1 must not apply a partial state: it trains on from the bucket's step alone
    (or, if the heal won the race, from the peer's), and both nodes end on the same bits."""
    flags = ["--nodes", "2", "--gpus", "cpu:1", "--recovery", "node", "--provision-delay", "1s"]
    args = ["--steps", "1500", "--ckpt-interval", "50", "--hidden", "1024"]  # a heal of ~13 MB
    up("cut", EXAMPLE, *flags, script_args=args)
    wait_until(lambda: max((s for _, s in steps_of("cut", 0)), default=0) >= 120, 180, "step 120")
    cli("chaos", "preempt", "cut", "--node", "1")
    lost_at = wait_until(
        lambda: [e.t for e in state_of("cut").events if e.kind == "node-lost"], 30, "node-lost"
    )[0]
    token = state_of("cut").token
    deadline = time.monotonic() + 120
    while not [r for r in events_of("cut", "join", 1) if r["t"] > lost_at]:  # poll fast: the
        assert time.monotonic() < deadline, "node 1's replacement never joined"  # heal is short
        time.sleep(0.005)
    with frozen(token, 0):  # the peer stops answering mid-heal, as behind a partition
        time.sleep(1.0)  # the frozen peer holds the transfer (or the quorum) for a second
        cli("chaos", "preempt", "cut", "--node", "0")
    final = wait_final("cut", 300)
    assert final.state is RunState.SUCCEEDED, run_log("cut")
    assert (final.attempt, final.restarts) == (1, 0), run_log("cut")  # never a gang relaunch
    start = next(r for r in events_of("cut", "start", 1) if r["t"] > lost_at)
    heals_of_1 = [h for h in events_of("cut", "heal", 1) if h["t"] > lost_at]
    first_step = min(s for t, s in steps_of("cut", 1) if t > lost_at)
    if not heals_of_1:  # the heal was cut: node 1 went on from its bucket step, whole
        assert first_step == start["resumed_from"] + 1
    # Node 0's replacement heals from node 1; or (it starts cold) finds the final step saved;
    # or node 1, its own heal cut, was no further than the bucket's step when node 0 joined
    # (both on the same step: nothing to heal).
    starts_0 = [r for r in events_of("cut", "start", 0) if r["t"] > lost_at]
    healed_0 = [h for h in events_of("cut", "heal", 0) if h["t"] > lost_at]
    if not healed_0 and starts_0[-1]["resumed_from"] != 1500:
        joined_0 = [r for r in events_of("cut", "join", 0) if r["t"] > lost_at][-1]
        ahead = [s for t, s in steps_of("cut", 1) if lost_at < t < joined_0["t"]]
        assert max(ahead, default=0) <= starts_0[-1]["resumed_from"], (ahead[-3:], starts_0)
    done = {r["node"]: r for r in events_of("cut", "done")}
    assert sorted(done) == [0, 1] and len({d["weights_sha256"] for d in done.values()}) == 1


@pytest.mark.slow
def test_a_step_another_replica_committed_is_never_overwritten(
    bucket_uri: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Node recovery: a replica that trained the tail alone (it joined as the others finished)
    does not write over their committed step; its last save loads those bits instead."""
    torch = pytest.importorskip("torch")
    from mncloud.train import CheckpointManager, Replicas

    monkeypatch.setenv(constants.RECOVERY_ENV, "node")

    def state(seed: int) -> dict[str, Any]:
        torch.manual_seed(seed)
        return {"model": torch.nn.Linear(8, 4), "loss": float(seed)}

    first, late = state(1), state(2)
    with CheckpointManager(bucket_uri, replicas=Replicas(first)) as ckpt:
        assert ckpt.save(10, first, wait=True)
    with CheckpointManager(bucket_uri, replicas=Replicas(late)) as ckpt:
        assert not ckpt.maybe_save(10, late)  # periodic: skipped, nothing written
        assert not torch.equal(late["model"].weight, first["model"].weight)
        assert not ckpt.save(10, late, wait=True)  # the last save: takes the committed bits
    assert torch.equal(late["model"].weight, first["model"].weight) and late["loss"] == 1.0
    check = state(3)
    with CheckpointManager(bucket_uri) as ckpt:
        assert ckpt.load(check) == 10
    assert torch.equal(check["model"].weight, first["model"].weight)


def test_without_node_recovery_replicas_is_the_plain_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    torch = pytest.importorskip("torch")
    from mncloud.errors import MncloudError
    from mncloud.train import Replicas

    monkeypatch.delenv(constants.RECOVERY_ENV, raising=False)
    model = torch.nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    replicas = Replicas({"model": model, "optimizer": opt})
    assert not replicas.enabled and replicas.saves
    seen = []
    for step, batch in replicas.steps([10, 11, 12], start=4, total=9):  # epochs of 3 batches
        model(torch.ones(2)).sum().backward()
        assert replicas.step(opt)
        seen.append((step, batch))
    assert seen == [(5, 10), (6, 11), (7, 12), (8, 10), (9, 11)] and replicas.committed_step == 9
    with pytest.raises(MncloudError, match="no batch"):
        list(Replicas({}).steps([], start=0, total=3))


def test_a_resume_at_the_very_end_of_an_epoch_goes_on_with_the_next(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A checkpoint taken after an epoch's last batch holds the sampler at the epoch's end: the
    first pass after the resume is empty, and the loop moves on to the next epoch."""
    torch = pytest.importorskip("torch")
    from torch.utils.data import DataLoader, TensorDataset

    from mncloud.train import Replicas, ResumableSampler

    monkeypatch.delenv(constants.RECOVERY_ENV, raising=False)
    data = TensorDataset(torch.arange(8.0))

    def loader() -> tuple[ResumableSampler, DataLoader]:
        sampler = ResumableSampler(data, seed=0, num_replicas=1, rank=0, drop_last=True)
        batches = DataLoader(data, batch_size=4, sampler=sampler, generator=torch.Generator())
        return sampler, batches

    first, batches = loader()
    seen = [step for step, _ in Replicas({}).steps(batches, start=0, total=2)]  # one epoch
    assert seen == [1, 2] and (first.epoch, first.position) == (0, 8)
    resumed, batches = loader()
    resumed.load_state_dict(first.state_dict())
    steps = [(step, batch[0].tolist()) for step, batch in Replicas({}).steps(batches, start=2,
                                                                              total=4)]  # fmt: skip
    assert [s for s, _ in steps] == [3, 4] and resumed.epoch == 1


def test_a_quorum_group_waits_for_an_absent_peer_only_the_configure_timeout() -> None:
    """A peer that died after the quorum formed never writes its address: making the group
    fails after the short configure timeout (not the hour-long collective one), and a group
    that does form keeps the collective timeout for its collectives."""
    torch = pytest.importorskip("torch")
    import threading
    from datetime import timedelta

    from torch.distributed import TCPStore

    from mncloud.train.ft import quorum_group

    store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    hour, second = timedelta(hours=1), timedelta(seconds=1)
    members: list[int] = []
    alone = quorum_group(members, timeout=hour, configure_timeout=second)
    outcome: list[BaseException] = []

    def configure_alone() -> None:
        try:
            alone.configure(f"127.0.0.1:{store.port}/a", "node0", 0, 2, 1, 0, 1, [0, 3])
        except Exception as err:
            outcome.append(err)

    thread = threading.Thread(target=configure_alone, daemon=True)
    thread.start()
    thread.join(120)  # liveness, not speed: the old hour-long wait would still be going
    assert not thread.is_alive() and outcome and "timeout" in str(outcome[0])
    assert members == [0, 3]  # global ranks 0 and 3 with one rank per node: nodes 0 and 3

    pair = [quorum_group([], timeout=hour, configure_timeout=second * 30) for _ in range(2)]
    threads = [
        threading.Thread(target=g.configure,
                         args=(f"127.0.0.1:{store.port}/b", f"node{r}", r, 2, 2, 0, 1, [0, 1]))
        for r, g in enumerate(pair)
    ]  # fmt: skip
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    backend = pair[0]._pg._get_backend(torch.device("cpu"))
    assert backend.options._timeout == hour and pair[0]._timeout == hour
