"""A PyTorch Lightning script as Lightning's docs write it: nothing of mncloud in it.

    mncloud up examples/lightning_train.py --nodes 2 --gpus H100:8 --spot \\
        --bucket s3://team-ckpt --ckpt-dir /ckpt
    mncloud up examples/lightning_train.py --cloud local --nodes 2 --gpus cpu:1 --ckpt-dir /ckpt

A small MLP learns a fixed random "teacher" network's outputs (data from a seed, nothing
downloaded). `ModelCheckpoint(dirpath=…, save_last=True)` writes `epoch=E-step=S.ckpt` and
`last.ckpt` into `$MNCLOUD_CKPT_DIR` (the `--ckpt-dir` folder, kept in the bucket) at the end of
each epoch; `trainer.fit(..., ckpt_path="last")` resumes from `last.ckpt` after a preemption
(and starts afresh when there is none). At the end the weights go to `final.pt` there.

`seed_everything(0, workers=True)` and `Trainer(deterministic=True)`: a run preempted and resumed
ends on the same weights as one that never stopped. The checkpoints are taken at epoch ends:
Lightning resumes a plain DataLoader exactly only there (mid-epoch it warns and replays the
epoch's start), and the epoch's order comes from the `DistributedSampler`'s seed and epoch.
With `--dropout P` the masks are random draws too: mncloud's callback (added on the local
backend; one line on a cloud, docs/guides/trainers.md) keeps every rank's RNG states in the
checkpoint, so the resumed run draws the masks the uninterrupted one drew.
`--nodes` is the run's nodes (`SKYPILOT_NUM_NODES`) and `--devices` the processes per node
(torchrun's `LOCAL_WORLD_SIZE`; GPUs on a GPU node): a Trainer left at one node under torchrun's
2 would train each node alone, and mncloud's callback refuses it.
`--logger` keeps Lightning's default logger, which writes `lightning_logs/` into the folder
(`default_root_dir`): mncloud keeps it file by file, as logs, not as a checkpoint.
`--mlflow` logs every step to MLflow instead, with an `MLFlowLogger` made as its docs make it
(the server from `MLFLOW_TRACKING_URI`): mncloud gives it the run's one MLflow run.
"""

from __future__ import annotations

import argparse
import os
import time

import lightning as L
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class Regressor(L.LightningModule):
    def __init__(
        self, hidden: int = 64, lr: float = 1e-2, compute_ms: float = 0.0, dropout: float = 0.0
    ) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Sequential(
            nn.Linear(16, hidden), nn.ReLU(), nn.Dropout(dropout), nn.Linear(hidden, 1)
        )

    def training_step(
        self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int
    ) -> torch.Tensor:
        x, y = batch
        loss = nn.functional.mse_loss(self.net(x), y)
        time.sleep(self.hparams.compute_ms / 1000)  # --compute-ms: a stand-in for GPU time
        self.log("loss", loss)
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.parameters(), lr=self.hparams.lr)


def data(samples: int) -> TensorDataset:
    gen = torch.Generator().manual_seed(1234)
    x = torch.randn(samples, 16, generator=gen)
    teacher = torch.randn(16, 1, generator=gen)
    return TensorDataset(x, torch.tanh(x @ teacher))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--epochs", type=int, default=20)
    p.add_argument("--samples", type=int, default=1024, help="size of the synthetic data set")
    p.add_argument("--nodes", type=int, default=int(os.environ.get("SKYPILOT_NUM_NODES", "1")))
    p.add_argument("--devices", type=int, default=int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    p.add_argument("--compute-ms", type=float, default=0.0, help="sleep per step (a stand-in)")
    p.add_argument("--dropout", type=float, default=0.0, help="dropout after the hidden layer")
    p.add_argument("--log-every-n-steps", type=int, default=10)
    p.add_argument("--ckpt-dir", default=os.environ.get("MNCLOUD_CKPT_DIR", "lightning-out"))
    p.add_argument(
        "--logger", action="store_true",
        help="keep Lightning's default logger: lightning_logs/ under default_root_dir",
    )  # fmt: skip
    p.add_argument("--mlflow", action="store_true", help="log every step to MLflow")
    args = p.parse_args()

    L.seed_everything(0, workers=True)
    logger = args.logger
    if args.mlflow:
        from lightning.pytorch.loggers import MLFlowLogger

        logger = MLFlowLogger()
    trainer = L.Trainer(
        max_epochs=args.epochs,
        num_nodes=args.nodes,
        devices=args.devices,
        strategy="ddp" if args.nodes * args.devices > 1 else "auto",
        deterministic=True,
        default_root_dir=args.ckpt_dir,
        callbacks=[ModelCheckpoint(dirpath=args.ckpt_dir, save_last=True)],
        logger=logger,
        enable_progress_bar=False,
        log_every_n_steps=1 if args.mlflow else args.log_every_n_steps,
    )
    loader = DataLoader(data(args.samples), batch_size=32, shuffle=True)
    model = Regressor(compute_ms=args.compute_ms, dropout=args.dropout)
    trainer.fit(model, loader, ckpt_path="last")
    if trainer.is_global_zero:
        torch.save(trainer.lightning_module.state_dict(), os.path.join(args.ckpt_dir, "final.pt"))


if __name__ == "__main__":
    main()
