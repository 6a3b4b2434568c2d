"""A multi-node DDP script in the style of PyTorch's tutorial (ddp-tutorial-series/multinode.py):
it saves its own `snapshot.pt` with torch.save, loads it when present, and imports nothing
of mncloud. Run under `--ckpt-dir`, the snapshot survives preemptions:

    mncloud up examples/train_snapshot.py --nodes 2 --gpus H100:8 --spot \\
        --bucket s3://team-ckpt --ckpt-dir /ckpt -- --snapshot /ckpt/snapshot.pt
    mncloud up examples/train_snapshot.py --cloud local --nodes 2 --gpus cpu:2 --ckpt-dir /ckpt

On the local backend every node has a folder of its own, named by MNCLOUD_CKPT_DIR: the
default `--snapshot` reads it (the one line here that knows mncloud exists).

Two changes from the tutorial make a resumed run end with the uninterrupted run's weights:
the snapshot records the next epoch to run (the tutorial re-runs the saved one), and the data
and the model come from fixed seeds. The snapshot is written beside its final name and
renamed onto it, so a reader sees the old snapshot or the new one, never half of one.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import time

import torch
import torch.nn.functional as F
from torch.distributed import destroy_process_group, init_process_group
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler


class MyTrainDataset(Dataset):
    def __init__(self, size: int):
        gen = torch.Generator().manual_seed(1234)
        self.data = [
            (torch.rand(20, generator=gen), torch.rand(1, generator=gen)) for _ in range(size)
        ]

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.data[index]


def ddp_setup() -> None:
    init_process_group(backend="nccl" if torch.cuda.is_available() else "gloo")
    if torch.cuda.is_available():
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))


class Trainer:
    def __init__(self, model, train_data, optimizer, save_every, snapshot_path, epoch_seconds):
        self.local_rank = int(os.environ["LOCAL_RANK"])
        self.global_rank = int(os.environ["RANK"])
        self.device = torch.device("cuda", self.local_rank) if torch.cuda.is_available() else None
        self.model = model.to(self.device) if self.device else model
        self.train_data = train_data
        self.optimizer = optimizer
        self.save_every = save_every
        self.snapshot_path = snapshot_path
        self.epoch_seconds = epoch_seconds
        self.epochs_run = 0
        if os.path.exists(snapshot_path):
            print(f"Loading snapshot {snapshot_path}", flush=True)
            self._load_snapshot(snapshot_path)
        ids = [self.local_rank] if self.device else None
        self.model = DDP(self.model, device_ids=ids)

    def _load_snapshot(self, snapshot_path: str) -> None:
        snapshot = torch.load(snapshot_path, map_location=self.device or "cpu")
        self.model.load_state_dict(snapshot["MODEL_STATE"])
        self.optimizer.load_state_dict(snapshot["OPTIMIZER_STATE"])
        self.epochs_run = snapshot["EPOCHS_RUN"]
        print(f"Resuming training from snapshot at epoch {self.epochs_run}", flush=True)

    def _run_batch(self, source: torch.Tensor, targets: torch.Tensor) -> None:
        self.optimizer.zero_grad()
        loss = F.mse_loss(self.model(source), targets)
        loss.backward()
        self.optimizer.step()

    def _run_epoch(self, epoch: int) -> None:
        started = time.monotonic()
        self.train_data.sampler.set_epoch(epoch)
        for source, targets in self.train_data:
            if self.device:
                source, targets = source.to(self.device), targets.to(self.device)
            self._run_batch(source, targets)
        time.sleep(max(0.0, self.epoch_seconds - (time.monotonic() - started)))
        print(f"[GPU{self.global_rank}] Epoch {epoch} done", flush=True)

    def _save_snapshot(self, epoch: int) -> None:
        snapshot = {
            "MODEL_STATE": self.model.module.state_dict(),
            "OPTIMIZER_STATE": self.optimizer.state_dict(),
            "EPOCHS_RUN": epoch + 1,
        }
        folder = os.path.dirname(os.path.abspath(self.snapshot_path))
        os.makedirs(folder, exist_ok=True)
        partial = f"{self.snapshot_path}.partial"
        torch.save(snapshot, partial)
        os.replace(partial, self.snapshot_path)  # readers see the old snapshot or the new one
        print(f"Epoch {epoch} | Training snapshot saved at {self.snapshot_path}", flush=True)

    def train(self, max_epochs: int) -> None:
        for epoch in range(self.epochs_run, max_epochs):
            self._run_epoch(epoch)
            if self.global_rank == 0 and epoch % self.save_every == 0:
                self._save_snapshot(epoch)
        if self.global_rank == 0:
            state = self.model.module.state_dict()
            final = os.path.join(os.path.dirname(os.path.abspath(self.snapshot_path)), "final.pt")
            torch.save(state, final)
            digest = hashlib.sha256(b"".join(t.numpy().tobytes() for t in state.values()))
            print(f"final weights sha256 {digest.hexdigest()}", flush=True)


def main(save_every: int, total_epochs: int, batch_size: int, snapshot_path: str, slow: float):
    ddp_setup()
    torch.manual_seed(0)
    torch.use_deterministic_algorithms(True)
    dataset = MyTrainDataset(512)
    model = torch.nn.Linear(20, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-2, momentum=0.9)
    loader = DataLoader(
        dataset, batch_size=batch_size, pin_memory=False, shuffle=False,
        sampler=DistributedSampler(dataset, seed=0),
    )  # fmt: skip
    Trainer(model, loader, optimizer, save_every, snapshot_path, slow).train(total_epochs)
    destroy_process_group()


if __name__ == "__main__":
    default_snapshot = os.path.join(os.environ.get("MNCLOUD_CKPT_DIR", "."), "snapshot.pt")
    parser = argparse.ArgumentParser(description="simple distributed training job")
    parser.add_argument("total_epochs", type=int, help="Total epochs to train the model")
    parser.add_argument("save_every", type=int, help="How often to save a snapshot")
    parser.add_argument("--batch_size", default=32, type=int, help="Input batch size per device")
    parser.add_argument("--snapshot", default=default_snapshot, help="Where the snapshot lives")
    parser.add_argument("--epoch-seconds", type=float, default=0.0, help="Stretch each epoch")
    args = parser.parse_args()
    main(args.save_every, args.total_epochs, args.batch_size, args.snapshot, args.epoch_seconds)
