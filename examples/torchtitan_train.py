"""torchtitan's own trainer, as `python -m torchtitan.train` starts it: nothing of mncloud in it.

    mncloud up examples/torchtitan_train.py --nodes 2 --gpus H100:8 --spot \\
        --bucket s3://team-ckpt --ckpt-dir /ckpt -- --module llama3 --config llama3_8b \\
        --hf_assets_path ./assets/hf/Llama-3.1-8B --checkpoint.enable
    mncloud up examples/torchtitan_train.py --cloud local --nodes 2 --gpus cpu:1 \\
        --ckpt-dir /ckpt -- --tiny-assets --module llama3 --config llama3_debugmodel \\
        --training.seq_len 128 --training.local_batch_size 2 --training.steps 20 \\
        --checkpoint.enable --checkpoint.interval 5 --parallelism.spmd_backend partial_dtensor

`torchrun` starts a script, so this file stands for `-m torchtitan.train`: it runs that module
with the same arguments and adds two things of this example only:
- `--checkpoint.folder` is `$MNCLOUD_CKPT_DIR` (the `--ckpt-dir` folder, kept in the bucket)
  unless given: an absolute folder, which torchtitan takes as it is, so each DCP `step-N/` is a
  top-level folder there, committed as a whole, and torchtitan resumes from the newest one.
- `--tiny-assets`: a small byte-level BPE tokenizer and a synthetic text set, built here offline
  (nothing downloaded) for the debug model, which otherwise reads torchtitan's repository
  `tests/assets`; `--hf_assets_path` and `--dataloader.dataset_path` point at them.

`--parallelism.spmd_backend partial_dtensor`: torchtitan 0.3.0's default (`spmd_types`) fails
in FSDP's setup with this torch (2.13), on GPUs as on CPU. On a CPU-only local node mncloud's
site hook supplies what torchtitan needs there (`mncloud/train/titan.py`).
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import runpy
import sys
import tempfile
from pathlib import Path

VOCABULARY = (
    "the of and to in a is that for it as was with be by on not this are or from at which but "
    "have an they you were there been one all we their has would when if so no will more can "
    "about out up what said some time model train data node cloud step loss gradient resume"
)
WORDS = VOCABULARY.split()


def _write(path: Path, text: str) -> None:
    """Write atomically: every rank of a node may build the same assets at once."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    tmp.write_text(text)
    os.replace(tmp, path)


def tiny_assets() -> tuple[Path, Path]:
    """(tokenizer folder, dataset folder), built once per machine from fixed seeds."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    recipe = hashlib.sha256(" ".join(WORDS).encode()).hexdigest()[:12]
    root = Path(tempfile.gettempdir()) / f"torchtitan-tiny-assets-{recipe}"
    tokenizer_dir, data_dir = root / "tokenizer", root / "c4_tiny"
    if (tokenizer_dir / "tokenizer_config.json").is_file():
        return tokenizer_dir, data_dir
    tokenizer_dir.mkdir(parents=True, exist_ok=True)
    data_dir.mkdir(parents=True, exist_ok=True)
    rng = random.Random(0)
    texts = [
        " ".join(rng.choice(WORDS) for _ in range(rng.randint(40, 200))) + "." for _ in range(2000)
    ]
    _write(data_dir / "c4_tiny.json", "".join(json.dumps({"text": t}) + "\n" for t in texts))
    tokenizer = Tokenizer(models.BPE(unk_token=None))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    bos, eos = "<|begin_of_text|>", "<|end_of_text|>"
    trainer = trainers.BpeTrainer(
        vocab_size=512, special_tokens=[bos, eos],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )  # fmt: skip
    tokenizer.train_from_iterator(texts, trainer)
    _write(tokenizer_dir / "tokenizer.json", tokenizer.to_str())
    config = {"bos_token": bos, "eos_token": eos, "add_bos_token": True, "add_eos_token": True,
              "tokenizer_class": "PreTrainedTokenizerFast"}  # fmt: skip
    _write(tokenizer_dir / "tokenizer_config.json", json.dumps(config))
    return tokenizer_dir, data_dir


def torchtitan_args(args: list[str]) -> list[str]:
    """This example's arguments turned into torchtitan's (module docstring)."""
    given = {a.split("=", 1)[0] for a in args if a.startswith("--")}
    out = [a for a in args if a != "--tiny-assets"]
    ckpt_dir = os.environ.get("MNCLOUD_CKPT_DIR")
    if ckpt_dir and "--checkpoint.folder" not in given:
        out += ["--checkpoint.folder", os.path.abspath(ckpt_dir)]
    if "--tiny-assets" in args:
        tokenizer_dir, data_dir = tiny_assets()
        out += ["--hf_assets_path", str(tokenizer_dir), "--dataloader.dataset_path", str(data_dir)]
    return out


if __name__ == "__main__":
    sys.argv = [sys.argv[0], *torchtitan_args(sys.argv[1:])]
    runpy.run_module("torchtitan.train", run_name="__main__", alter_sys=True)
