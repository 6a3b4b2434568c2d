"""A script shaped like transformers' `examples/pytorch/language-modeling/run_clm.py` (v5):
every setting on the command line through `HfArgumentParser`, the output folder only as
`--output_dir`, and a resume only when `--resume_from_checkpoint PATH` is given (a path that
must exist, so it cannot be on a first attempt's command line). Nothing of mncloud in it.

    torchrun --nproc_per_node=2 tests/data/clm_shaped.py --output_dir out --max_steps 40 \\
        --save_steps 10 --seed 0 --data_seed 0 --full_determinism --save_on_each_node
    ... --resume_from_checkpoint out/checkpoint-20     # what a user adds by hand to resume

A tiny GPT-2 built from its config (nothing downloaded) learns synthetic token sequences; the
model is saved into `output_dir` at the end (`model.safetensors`), as run_clm.py does.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch
from transformers import (
    GPT2Config,
    GPT2LMHeadModel,
    HfArgumentParser,
    Trainer,
    TrainerCallback,
    TrainingArguments,
    set_seed,
)


@dataclass
class ScriptArguments:
    """What run_clm.py's `ModelArguments` / `DataTrainingArguments` stand for here."""

    n_layer: int = field(default=2)
    samples: int = field(default=2048)
    compute_ms: float = field(default=0.0, metadata={"help": "sleep per step (a stand-in)"})


def grouped_blocks(samples: int, block_size: int, vocab: int) -> list[dict[str, torch.Tensor]]:
    """run_clm.py's `group_texts`: one long token stream cut into blocks, the labels the
    inputs (the model shifts them); here a seeded random stream stands for the tokenized text."""
    gen = torch.Generator().manual_seed(1234)
    stream = torch.randint(0, vocab, (samples * block_size,), generator=gen)
    return [{"input_ids": block, "labels": block} for block in stream.view(samples, block_size)]


class ComputeTime(TrainerCallback):
    """A sleep after each step, standing for accelerator time (no weight depends on it)."""

    def __init__(self, ms: float) -> None:
        self.seconds = ms / 1000

    def on_step_end(self, args: TrainingArguments, state: object, control: object, **kw: object):
        time.sleep(self.seconds)


def main() -> None:
    parser = HfArgumentParser((ScriptArguments, TrainingArguments))
    script, training_args = parser.parse_args_into_dataclasses()
    set_seed(training_args.seed)
    config = GPT2Config(vocab_size=128, n_positions=32, n_embd=64, n_layer=script.n_layer, n_head=2)
    trainer = Trainer(
        model=GPT2LMHeadModel(config),
        args=training_args,
        train_dataset=grouped_blocks(script.samples, config.n_positions, 128),
        callbacks=[ComputeTime(script.compute_ms)] if script.compute_ms else None,
    )
    # As run_clm.py (transformers 5): only the checkpoint the command line names.
    trainer.train(resume_from_checkpoint=training_args.resume_from_checkpoint)
    trainer.save_model()


if __name__ == "__main__":
    main()
