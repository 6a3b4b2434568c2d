"""`CheckpointManager`'s save and resume of a multi-GB state against a raw copy (#57, point 3).

    .venv/bin/python bench/_scale_ckpt.py [--gb 2] [--repeats 3]

One process, one rank, SeaweedFS from `tests/servers.py` (its data in /dev/shm when there is
room). The state: `--gb` GB of fp32 tensors in 8 parameters of one model. Ours:

- **upload**: `CheckpointManager.save(step, state, wait=True)` from the staged snapshot on:
  DCP's write streamed into multipart uploads (16 MiB parts, 8 in flight), hashed as the bytes
  pass with the chunk hashes of the sidecars, then the manifest and COMPLETE (the staging copy
  before it is the training thread's stall, `bench/ckpt.py`'s figure; the CPU per GB printed
  counts it too);
- **restore**: `CheckpointManager.load(state)` into the model's own (already written) tensors:
  the manifest and DCP's metadata, the ranged reads checked against the chunk hashes, each
  tensor viewed where its bytes lie and copied into place.

The baseline is boto3's transfer manager copying the step's own files (its shards, sidecars and
small files, downloaded once into a folder) at the best of several concurrencies and part
sizes (`_scale_ckptdir.race`: raw, ours, raw in each round; the median ratio is the figure,
goal ≥ 0.9). The raw copy moves bytes from and to a file; ours from and to the model's tensors.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import torch  # noqa: E402
from _scale_ckptdir import Raw, _timed, race, seaweed, vacuum  # noqa: E402

from mncloud.storage import CheckpointStore  # noqa: E402
from mncloud.train import CheckpointManager  # noqa: E402
from tests.servers import S3Server  # noqa: E402

LAYERS = 8


def _model(gb: float) -> torch.nn.Module:
    """`LAYERS` square linear layers (no bias) holding `gb` GB of fp32 weights in all."""
    side = int((gb * 1e9 / 4 / LAYERS) ** 0.5)
    torch.manual_seed(0)
    return torch.nn.Sequential(*(torch.nn.Linear(side, side, bias=False) for _ in range(LAYERS)))


def speed_figures(server: S3Server, work: Path, gb: float, repeats: int) -> dict[str, float]:
    """Save and resume of a `gb` GB state against the transfer manager's best."""
    name = server.make_bucket()
    uri = f"s3://{name}/run"
    model = _model(gb)
    state = {"model": model}
    steps = iter(range(1, 10_000))

    def upload_ours() -> float:
        with CheckpointManager(uri, keep=2) as ckpt:
            _timed(lambda: ckpt.save(next(steps), state, wait=True))
            phases = ckpt.last_phases
        vacuum(server)
        return phases["write_s"] + phases["upload_s"] + phases["commit_s"]  # after staging

    def restore_ours() -> float:
        with torch.no_grad():
            for p in model.parameters():
                p.zero_()  # written already, as a model's tensors are before it resumes
        with CheckpointManager(uri, keep=2) as ckpt:
            return _timed(lambda: ckpt.load(state))

    upload_ours()  # the step the raw copy copies, and a warm-up
    store = CheckpointStore(uri)
    newest = store.candidates()[0][0]
    src = work / "src"
    store.pull(newest, src, content=False)
    (src / "manifest.json").unlink()
    size = sum(p.stat().st_size for p in src.iterdir())
    figures = race(server, Raw(server, name, src), {"up": upload_ours, "down": restore_ours},
                   scratch=work / "raw", repeats=repeats, size=size, prefix="ckpt")  # fmt: skip
    return {"ckpt_state_gb": size / 1e9, **figures}


def figures(gb: float = 2, repeats: int = 3) -> dict[str, float]:
    """Every figure of this bench (see the module docstring)."""
    with seaweed(gb, "mncloud-scale-ckpt-") as (server, work):
        return speed_figures(server, work, gb, repeats)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gb", type=float, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    for key, value in figures(args.gb, args.repeats).items():
        print(f"{key:34} {value:10.2f}")


if __name__ == "__main__":
    main()
