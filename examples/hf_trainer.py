"""A Hugging Face `Trainer` script as the Trainer's docs write it: nothing of mncloud in it.

    mncloud up examples/hf_trainer.py --nodes 2 --gpus H100:8 --spot \\
        --bucket s3://team-ckpt --ckpt-dir /ckpt
    mncloud up examples/hf_trainer.py --cloud local --nodes 2 --gpus cpu:1 --ckpt-dir /ckpt
    torchrun --nproc_per_node=2 examples/hf_trainer.py --max-steps 40     # without mncloud

A tiny GPT-2 built from its config (nothing downloaded) learns synthetic token sequences.
The Trainer writes `checkpoint-N/` folders (weights, optimizer, scheduler, RNG states,
`trainer_state.json`) into `output_dir`, here `$MNCLOUD_CKPT_DIR` (the `--ckpt-dir` folder, kept
in the bucket), and `train(resume_from_checkpoint=get_last_checkpoint(output_dir))` resumes
from the newest one after a preemption. At the end the model goes to `output_dir/final`.

`set_seed` before the model is built, and `full_determinism=True` with fixed `seed` and
`data_seed`: a run preempted and resumed ends on the same weights as one that never stopped
(the RNG states are in each checkpoint).
`save_on_each_node=True`: each node writes the folder on its own disk (nodes share no file
system); under `--ckpt-dir` every node's copy is the same folder in the bucket.
`--mlflow` logs every step to MLflow through the Trainer's own `MLflowCallback` (the server
from `MLFLOW_TRACKING_URI`, the run from `MLFLOW_RUN_ID`, which mncloud sets).
"""

from __future__ import annotations

import argparse
import os
import time

import torch
from torch.utils.data import Dataset
from transformers import (
    GPT2Config,
    GPT2LMHeadModel,
    Trainer,
    TrainerCallback,
    TrainingArguments,
    set_seed,
)
from transformers.trainer_utils import get_last_checkpoint


class Tokens(Dataset):
    """Synthetic token sequences from a fixed seed: a repeating pattern with noise."""

    def __init__(self, samples: int, length: int, vocab: int) -> None:
        gen = torch.Generator().manual_seed(1234)
        start = torch.randint(0, vocab, (samples, 1), generator=gen)
        step = torch.randint(1, 4, (samples, 1), generator=gen)
        self.ids = (start + step * torch.arange(length)) % vocab

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


class ComputeTime(TrainerCallback):
    """`--compute-ms`: a sleep after each step, standing for accelerator time (no weight
    depends on it; a test preempts the run in the middle)."""

    def __init__(self, ms: float) -> None:
        self.seconds = ms / 1000

    def on_step_end(self, args: TrainingArguments, state: object, control: object, **kw: object):
        time.sleep(self.seconds)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--max-steps", type=int, default=200)
    p.add_argument("--save-steps", type=int, default=20)
    p.add_argument("--save-total-limit", type=int, default=2,
                   help="checkpoints the Trainer keeps (0: every one)")  # fmt: skip
    p.add_argument("--batch-size", type=int, default=8, help="sequences per process per step")
    p.add_argument("--output-dir", default=os.environ.get("MNCLOUD_CKPT_DIR", "hf-out"))
    p.add_argument("--compute-ms", type=float, default=0.0, help="sleep per step (a stand-in)")
    p.add_argument("--logging-steps", type=int, default=10)
    p.add_argument("--report-to", default="none", help="the Trainer's loggers: tensorboard,wandb")
    p.add_argument("--mlflow", action="store_true",
                   help="log every step to MLflow (the Trainer's MLflowCallback)")  # fmt: skip
    args = p.parse_args()

    training_args = TrainingArguments(
        output_dir=args.output_dir,
        max_steps=args.max_steps,
        save_steps=args.save_steps,
        save_total_limit=args.save_total_limit or None,
        per_device_train_batch_size=args.batch_size,
        learning_rate=1e-3,
        logging_steps=1 if args.mlflow else args.logging_steps,
        seed=0,
        data_seed=0,
        full_determinism=True,
        use_cpu=not torch.cuda.is_available(),
        save_on_each_node=True,
        report_to=["mlflow"] if args.mlflow else args.report_to.split(","),
    )
    # Seeded before the model is built, as the Trainer's examples do (run_clm.py): the
    # initial weights are then the same in every run, and so are the final ones.
    set_seed(training_args.seed)
    config = GPT2Config(vocab_size=128, n_positions=32, n_embd=64, n_layer=2, n_head=2)
    model = GPT2LMHeadModel(config)
    trainer = Trainer(
        model=model,
        args=training_args,
        train_dataset=Tokens(2048, config.n_positions, 128),
        callbacks=[ComputeTime(args.compute_ms)] if args.compute_ms else None,
    )
    # As the Trainer's own examples (run_clm.py) write it: the newest checkpoint-N, if any.
    last = get_last_checkpoint(args.output_dir) if os.path.isdir(args.output_dir) else None
    trainer.train(resume_from_checkpoint=last)
    trainer.save_model(os.path.join(args.output_dir, "final"))


if __name__ == "__main__":
    main()
