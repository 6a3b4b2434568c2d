"""GPU checkpoint benchmark: CheckpointManager with CUDA tensors, and exact resume under NCCL.

1. Save/load of GPU tensors: a model + AdamW state of `--gb` GB on the GPU, checkpointed to a
   local-directory bucket (`file://`). Figures: blocking save time; the async save's stall on
   the training thread (the `maybe_save` call) vs the blocking save (ratio, goal ≤ 0.1); the
   first async save (buffers allocated in the background from `load` on) vs later ones; the
   D2H staging bandwidth vs a plain copy of the same tensors into pinned memory; training step
   time while an upload runs vs without; load back to the GPU vs `torch.load` of the same
   tensors; bitwise equality of every tensor after the load.
2. Exact resume: a real `torchrun` job (`bench/_gpu_train.py`, NCCL on CUDA, one process per
   GPU; deterministic algorithms, CUBLAS_WORKSPACE_CONFIG=:4096:8) trained `--steps` steps
   uninterrupted, vs the same job SIGKILLed (launcher and workers) mid-run and started again: it
   resumes from the newest COMPLETE step. Figures: steps lost, resume time (relaunch to first
   new step) vs the cold start of the uninterrupted job, final weights/optimizer bitwise equal.

Without CUDA it runs the same on the CPU (gloo, smaller sizes); a missing part is skipped with
the reason.

    python3 bench/gpu.py [--gb 3] [--repeats 3] [--steps 300] [--part all|save|resume]
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
TRAIN = Path(__file__).resolve().parent / "_gpu_train.py"
LAYER = 4096  # square Linear layers: 64 MiB of fp32 weights each


def missing() -> str | None:
    """Why the benchmark cannot run here, or None."""
    try:
        import torch  # noqa: F401
    except ImportError:
        return "torch is not installed"
    try:
        import mncloud.train  # noqa: F401
    except ImportError as err:
        return f"mncloud.train does not import: {err}"
    return None


def describe() -> str:
    """The device, torch and (on CUDA) NCCL version, in one line."""
    import torch

    if not torch.cuda.is_available():
        return f"CPU only ({os.cpu_count()} cores), torch {torch.__version__}"
    props = torch.cuda.get_device_properties(0)
    nccl = ".".join(map(str, torch.cuda.nccl.version()))
    return (f"{props.name} ({props.total_memory / 2**30:.0f} GiB), torch {torch.__version__}, "
            f"CUDA {torch.version.cuda}, NCCL {nccl}")  # fmt: skip


def sync() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


# ---------------------------------------------------------------------- part 1: save and load
class Trainer:
    """Square Linear layers with AdamW on `dev`: ~`gb` GB of weights + optimizer state."""

    def __init__(self, gb: float, dev: Any, seed: int) -> None:
        import torch

        torch.manual_seed(seed)
        n_layers = max(1, round(gb * 1e9 / 3 / (LAYER * LAYER * 4)))
        self.model = torch.nn.Sequential(
            *[torch.nn.Linear(LAYER, LAYER, bias=False) for _ in range(n_layers)]
        ).to(dev)
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-4)
        self.x = torch.randn(64, LAYER, device=dev)
        self.state: dict[str, Any] = {"model": self.model, "optimizer": self.opt, "step": 0}
        self.step()  # the optimizer's state exists from the first step on

    def step(self) -> None:
        self.opt.zero_grad(set_to_none=True)
        self.model(self.x).square().mean().backward()
        self.opt.step()

    def tensors(self) -> dict[str, Any]:
        """Every tensor of the state by name (the live tensors, not copies)."""
        out = {f"model.{k}": v for k, v in self.model.state_dict().items()}
        for idx, per in self.opt.state_dict()["state"].items():
            out.update({f"optimizer.{idx}.{k}": v for k, v in per.items()})
        return out

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors().values())


def bitwise_mismatches(ref: dict[str, Any], now: dict[str, Any]) -> list[str]:
    """What differs between `ref` (clones of the saved tensors, on their devices) and `now`:
    each name with the reason (missing, dtype/shape, device, bits)."""
    import torch

    bad = [f"{k} (missing)" for k in ref if k not in now]
    for k, t in now.items():
        r = ref.get(k)
        if r is None:
            why = "not saved"
        elif (t.shape, t.dtype) != (r.shape, r.dtype):
            why = f"{t.dtype}{list(t.shape)}, saved {r.dtype}{list(r.shape)}"
        elif t.device != r.device:
            why = f"on {t.device}, saved from {r.device}"
        elif not torch.equal(t.reshape(-1).view(torch.uint8), r.reshape(-1).view(torch.uint8)):
            why = "bits"
        else:
            continue
        bad.append(f"{k} ({why})")
    return bad


def raw_d2h_s(tensors: dict[str, Any]) -> float:
    """Seconds to copy `tensors` into pinned CPU buffers allocated beforehand (the baseline)."""
    import torch

    pin = torch.cuda.is_available()
    bufs = {k: torch.empty(t.shape, dtype=t.dtype, pin_memory=pin) for k, t in tensors.items()}
    sync()
    t0 = time.perf_counter()
    for k, t in tensors.items():
        bufs[k].copy_(t)
    sync()
    return time.perf_counter() - t0


def step_time_s(tr: Trainer, n: int = 10) -> float:
    """Mean seconds per training step (synchronised)."""
    sync()
    t0 = time.perf_counter()
    for _ in range(n):
        tr.step()
    sync()
    return (time.perf_counter() - t0) / n


def blocking_saves(tr: Trainer, work: Path, repeats: int) -> tuple[list[float], dict[str, float]]:
    """Seconds per blocking save (`async_upload=False`), and the last one's phases."""
    from mncloud.train import CheckpointManager

    ckpt = CheckpointManager(f"file://{work / 'block'}", keep=2, async_upload=False)
    ckpt.load(tr.state)  # allocates the staging buffers, as for the async saves
    times = []
    for r in range(repeats):
        tr.step()
        sync()
        t0 = time.perf_counter()
        ckpt.save(r + 1, tr.state)
        times.append(time.perf_counter() - t0)
    phases = dict(ckpt.last_phases)
    ckpt.close()
    return times, phases


def async_saves(tr: Trainer, work: Path, repeats: int) -> dict[str, Any]:
    """Async saves from `maybe_save`: stalls, phases, step times during the uploads; the last
    save is taken with a snapshot of its tensors (for the bitwise check after loading)."""
    from mncloud.train import CheckpointManager

    ckpt = CheckpointManager(f"file://{work / 'async'}", keep=2, interval_steps=1)
    t0 = time.perf_counter()
    ckpt.load(tr.state)  # empty bucket: lists it, starts allocating the staging buffers
    ckpt._slots.wait_warm()  # (in the background: the time until they are all there)
    warm_s = time.perf_counter() - t0
    stalls, stages, during = [], [], []
    phases: dict[str, float] = {}
    for r in range(repeats + 1):
        tr.step()
        sync()
        t0 = time.perf_counter()
        ckpt.maybe_save(r + 1, tr.state)
        stalls.append(time.perf_counter() - t0)
        stages.append(ckpt.last_phases.get("stage_s", float("nan")))
        pending = ckpt._pending
        n = 0
        t0 = time.perf_counter()
        while pending is not None and not pending.future.done():  # train while it uploads
            tr.step()
            sync()
            n += 1
        if n:
            during.append((time.perf_counter() - t0) / n)
        ckpt.wait()
        phases = dict(ckpt.last_phases)
    sync()
    ref = {k: v.clone() for k, v in tr.tensors().items()}
    last = repeats + 2
    ckpt.save(last, tr.state, wait=True)
    ckpt.close()
    return {"warm_s": warm_s, "stalls": stalls, "stages": stages, "during": during,
            "phases": phases, "ref": ref, "step": last}  # fmt: skip


def load_back(gb: float, dev: Any, work: Path, ref: dict[str, Any], step: int) -> dict[str, Any]:
    """Load the last async save into a fresh model/optimizer on `dev`; time it against
    `torch.load` of the same tensors from one file on the same disk; compare the bits."""
    import torch

    from mncloud.train import CheckpointManager

    fresh = Trainer(gb, dev, seed=1)  # other weights, other optimizer state
    ckpt = CheckpointManager(f"file://{work / 'async'}", keep=2)
    sync()
    t0 = time.perf_counter()
    got = ckpt.load(fresh.state)
    sync()
    load_s = time.perf_counter() - t0
    ckpt.close()
    now = fresh.tensors()
    bad = bitwise_mismatches(ref, now)
    devices = collections.Counter(str(t.device) for t in now.values())
    raw = work / "raw.pt"
    torch.save({k: v.cpu() for k, v in ref.items()}, raw)
    sync()
    t0 = time.perf_counter()
    back = torch.load(raw, map_location=dev)
    sync()
    raw_s = time.perf_counter() - t0
    del back
    return {"step": got, "want": step, "load_s": load_s, "raw_s": raw_s, "bad": bad,
            "n": len(ref), "devices": dict(devices)}  # fmt: skip


def part_save(gb: float, repeats: int) -> None:
    """Print the save/load figures of a `gb` GB GPU state (CPU without CUDA)."""
    import torch

    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    work = Path(tempfile.mkdtemp(prefix="mncloud-gpubench-"))
    try:
        tr = Trainer(gb, dev, seed=0)
        nbytes = tr.nbytes()
        gbs = nbytes / 1e9
        print(f"\n== 1. save/load: {gbs:.2f} GB state ({len(tr.tensors())} tensors) on {dev}; "
              f"bucket file://{work} (local directory, no S3 server)")  # fmt: skip
        shm = shutil.disk_usage("/dev/shm").free / 1e9 if Path("/dev/shm").is_dir() else 0.0
        print(f"   /dev/shm free {shm:.1f} GB (staging folder goes there when 2x state fits)")
        raw = statistics.median(raw_d2h_s(tr.tensors()) for _ in range(3))
        idle = step_time_s(tr)
        block, bphases = blocking_saves(tr, work, repeats)
        res = async_saves(tr, work, repeats)
        report_save(gbs, raw, idle, block, bphases, res)
        del tr
        loaded = load_back(gb, dev, work, res.pop("ref"), res["step"])
        report_load(gbs, loaded, res["warm_s"])
    finally:
        shutil.rmtree(work, ignore_errors=True)


def report_save(gbs: float, raw: float, idle: float, block: list[float],
                bphases: dict[str, float], res: dict[str, Any]) -> None:  # fmt: skip
    med = statistics.median
    first, later = res["stalls"][0], res["stalls"][1:]
    stall = med(later)
    stage = med(res["stages"][1:])
    print(f"   blocking save (save+write+copy to bucket+commit): median {med(block):.3f} s "
          f"over {len(block)}  [{', '.join(f'{b:.3f}' for b in block)}]")  # fmt: skip
    print("     phases of the last: " + ", ".join(f"{k} {v:.3f}s" for k, v in bphases.items()))
    print(f"   async save, maybe_save stall on the caller: median {stall:.3f} s over "
          f"{len(later)} later saves  [{', '.join(f'{s:.3f}' for s in later)}]")  # fmt: skip
    print(f"   stall ratio async / blocking: {stall / med(block):.4f}  goal <= 0.1  "
          f"{'MET' if stall / med(block) <= 0.1 else 'MISSED'}")  # fmt: skip
    print(f"   first async save after load: {first:.3f} s = {first / stall:.2f}x a later one "
          f"(staging buffers allocated in the background from load on: "
          f"{res['warm_s']:.3f} s)")  # fmt: skip
    print(f"   D2H staging: {stage:.3f} s = {gbs / stage:.2f} GB/s; plain copy into pinned "
          f"buffers {raw:.3f} s = {gbs / raw:.2f} GB/s; ratio {raw / stage:.2f}")  # fmt: skip
    print("     phases of the last async save: "
          + ", ".join(f"{k} {v:.3f}s" for k, v in res["phases"].items()))  # fmt: skip
    if res["during"]:
        during = med(res["during"])
        print(f"   training step while an upload runs: {during * 1e3:.2f} ms vs {idle * 1e3:.2f} "
              f"ms without ({during / idle:.2f}x)")  # fmt: skip


def report_load(gbs: float, res: dict[str, Any], warm_s: float) -> None:
    load_s, raw_s = res["load_s"], res["raw_s"]
    print(f"   load back to a fresh model/optimizer: step {res['step']} (want {res['want']}) in "
          f"{load_s:.3f} s = {gbs / load_s:.2f} GB/s (the staging buffers for the next saves, "
          f"~{warm_s:.3f} s, are allocated in the background after it)")  # fmt: skip
    print(f"   torch.load of the same tensors from one file to the device: {raw_s:.3f} s; "
          f"ratio load / torch.load {load_s / raw_s:.2f}x")  # fmt: skip
    ok = not res["bad"] and res["step"] == res["want"]
    print(
        f"   bitwise equal after load: {'YES' if ok else 'NO'} ({res['n'] - len(res['bad'])}/"
        f"{res['n']} tensors, on the device each was saved from: {res['devices']}"
        f"{'; differ: ' + ', '.join(res['bad'][:5]) if res['bad'] else ''})"
    )


# ---------------------------------------------------------------------- part 2: exact resume
class Job:
    """One launch of `torchrun bench/_gpu_train.py` against the bucket in `work/<name>`."""

    def __init__(self, work: Path, name: str, train_args: list[str]) -> None:
        self.work, self.name = work, name
        self.progress = work / f"{name}.progress.jsonl"
        self.out = work / f"{name}.result.json"
        self.log = work / f"{name}.log"
        self.uri = f"file://{work / name}"
        self.args = train_args
        self.proc: subprocess.Popen[bytes] | None = None
        self.launched = 0.0

    def launch(self) -> None:
        import torch

        env = dict(os.environ, MNCLOUD_CKPT_URI=self.uri, CUBLAS_WORKSPACE_CONFIG=":4096:8",
                   PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
                   PYTHONUNBUFFERED="1")  # fmt: skip
        if not torch.cuda.is_available():
            env["MNCLOUD_CPU_THREADS"] = "1"  # the same float sums in both runs
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               "--nproc_per_node=1", str(TRAIN), *self.args, "--progress", str(self.progress),
               "--out", str(self.out)]  # fmt: skip
        self.launched = time.time()
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT,
                                         start_new_session=True)  # fmt: skip

    def records(self) -> list[dict[str, Any]]:
        if not self.progress.exists():
            return []
        return [json.loads(line) for line in self.progress.read_text().splitlines() if line]

    def last_step(self) -> int:
        return max((r["step"] for r in self.records() if "step" in r), default=0)

    def wait(self, timeout: float) -> dict[str, Any]:
        """The job's result; SystemExit with its log's tail if it failed or timed out."""
        assert self.proc is not None
        try:
            rc = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            rc = -1
        if rc != 0 or not self.out.exists():
            tail = self.log.read_text(errors="replace")[-3000:]
            raise SystemExit(f"gpu.py: job {self.name} failed (rc {rc}):\n{tail}")
        return json.loads(self.out.read_text())

    def kill(self) -> None:
        """SIGKILL the launcher and every worker (torchrun starts them in new sessions)."""
        import psutil

        assert self.proc is not None
        try:
            procs = [psutil.Process(self.proc.pid)]
            procs += procs[0].children(recursive=True)
        except psutil.NoSuchProcess:
            procs = []
        for p in procs:
            with contextlib.suppress(psutil.NoSuchProcess):
                p.send_signal(signal.SIGKILL)
        psutil.wait_procs(procs, timeout=30)
        self.proc.wait()

    def first_step_after(self, start: int) -> tuple[dict[str, Any], float]:
        """This launch's start record, and seconds from launch to its first step."""
        recs = [r for r in self.records() if r["t"] >= self.launched]
        begin = next(r for r in recs if r.get("event") == "start")
        first = next(r for r in recs if r.get("step", -1) > start)
        return begin, first["t"] - self.launched


def committed_steps(uri: str) -> list[int]:
    """The steps of `uri` that verify (COMPLETE, manifest, every file), newest first."""
    from mncloud.storage.checkpoints import CheckpointStore

    return CheckpointStore(uri).candidates()[0]


def part_resume(steps: int, interval: int, gpu_args: list[str], timeout: float) -> None:
    """Uninterrupted job vs killed + resumed job: steps lost, resume time, bitwise equality."""
    import torch.distributed as dist

    if not dist.is_available():
        print("\n== 2. exact resume: SKIPPED (torch.distributed is not available)")
        return
    work = Path(tempfile.mkdtemp(prefix="mncloud-gpuresume-"))
    args = ["--steps", str(steps), "--interval", str(interval), *gpu_args]
    try:
        full = Job(work, "full", args)
        full.launch()
        ref = full.wait(timeout)
        begin, cold_s = full.first_step_after(0)
        total_s = max(r["t"] for r in full.records()) - full.launched
        print(
            f"\n== 2. exact resume: torchrun, 1 process, backend {begin['backend']} on "
            f"{begin['device']}, {steps} steps, checkpoint every {interval}; bucket file://; "
            f"{begin['ddp']}"
        )
        print(f"   uninterrupted: {total_s:.1f} s, first step {cold_s:.2f} s after launch")
        cut = Job(work, "cut", args)
        kill_at = steps // 2 + interval // 2  # between two checkpoints, mid-run
        cut.launch()
        deadline = time.monotonic() + timeout
        while cut.last_step() < kill_at and cut.proc is not None and cut.proc.poll() is None:
            if time.monotonic() > deadline:
                raise SystemExit("gpu.py: the job to kill never reached its step")
            time.sleep(0.01)
        cut.kill()
        killed = cut.last_step()
        done = committed_steps(cut.uri)
        print(f"   killed (SIGKILL, launcher + workers) after step {killed}; COMPLETE steps "
              f"then: {done}")  # fmt: skip
        cut.launch()
        res = cut.wait(timeout)
        begin, resume_s = cut.first_step_after(res["resumed_from"])
        report_resume(ref, res, killed, begin, resume_s, cold_s)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def report_resume(ref: dict[str, Any], res: dict[str, Any], killed: int, begin: dict[str, Any],
                  resume_s: float, cold_s: float) -> None:  # fmt: skip
    start = res["resumed_from"]
    print(f"   resumed from step {start}: steps lost {killed - start}; first new step "
          f"{resume_s:.2f} s after relaunch (load {begin['load_s']:.2f} s) vs cold start "
          f"{cold_s:.2f} s ({resume_s / cold_s:.2f}x)")  # fmt: skip
    same_w = res["weights_sha256"] == ref["weights_sha256"]
    same_o = res["optimizer_sha256"] == ref["optimizer_sha256"]
    print(f"   final weights bitwise equal: {'YES' if same_w else 'NO'}; optimizer state: "
          f"{'YES' if same_o else 'NO'}; loss {res['loss']:.6f} vs {ref['loss']:.6f}; "
          f"sha256 {res['weights_sha256'][:16]} vs {ref['weights_sha256'][:16]}")  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--part", choices=["all", "save", "resume"], default="all")
    ap.add_argument("--gb", type=float, help="part 1 state size (default 3 on CUDA, 0.2 CPU)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--steps", type=int, default=300, help="part 2 training steps")
    ap.add_argument("--interval", type=int, default=25, help="part 2 checkpoint interval")
    ap.add_argument("--timeout", type=float, default=300, help="part 2: seconds per job")
    args = ap.parse_args()
    reason = missing()
    if reason:
        print(f"gpu.py: SKIPPED: {reason}")
        return
    import logging

    import torch

    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    cuda = torch.cuda.is_available()
    print(f"device: {describe()}")
    if not cuda:
        print("no CUDA: running on the CPU with gloo and smaller sizes")
        torch.set_num_threads(max(1, min(4, os.cpu_count() or 1)))
    if args.part in ("all", "save"):
        part_save(args.gb or (3.0 if cuda else 0.2), args.repeats)
    if args.part in ("all", "resume"):
        small = [] if cuda else ["--hidden", "256", "--layers", "3", "--batch-size", "64"]
        part_resume(args.steps, args.interval, small, args.timeout)


if __name__ == "__main__":
    main()
