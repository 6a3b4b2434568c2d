"""A script shaped like a Hugging Face Trainer run, for `--ckpt-dir` tests (no torch, no mncloud).

Every EVERY steps each node writes `tmp-checkpoint-N/` file by file (node 0 the shared files,
every node its `rng_state_<node>.pth`, PAUSE seconds apart) and renames it onto
`checkpoint-N`; the other nodes start their save 10 PAUSEs late (slower nodes), so node 0's
share of a folder is in the bucket while theirs is still being written. At start it resumes
from the newest `checkpoint-N` in `$MNCLOUD_CKPT_DIR`, as `get_last_checkpoint` does, and
exits 3 if that folder is torn (a file of any node missing).

    python hf_shaped_saves.py STEPS EVERY PAUSE STEP_SECONDS
"""

import json
import os
import re
import shutil
import sys
import time
from pathlib import Path

SHARED = ["model.safetensors", "optimizer.pt", "scheduler.pt", "trainer_state.json"]
root = Path(os.environ["MNCLOUD_CKPT_DIR"])
node, nodes = int(os.environ["NODE_RANK"]), int(os.environ["NNODES"])
steps, every, pause, step_s = (
    int(sys.argv[1]),
    int(sys.argv[2]),
    float(sys.argv[3]),
    float(sys.argv[4]),
)


def newest() -> tuple[int, Path | None]:
    found = [
        (int(m[1]), p) for p in root.iterdir() if (m := re.fullmatch(r"checkpoint-(\d+)", p.name))
    ]
    return max(found) if found else (0, None)


start, folder = newest()
if folder is not None:
    want = sorted(SHARED + [f"rng_state_{n}.pth" for n in range(nodes)])
    have = sorted(os.listdir(folder))
    if have != want or json.loads((folder / "trainer_state.json").read_text())["step"] != start:
        print(f"node {node}: torn {folder.name}: {have}", flush=True)
        sys.exit(3)
    print(f"node {node} resumed from {folder.name}", flush=True)
for step in range(start + 1, steps + 1):
    time.sleep(step_s)
    if step % every:
        continue
    if node:
        time.sleep(10 * pause)
    tmp = root / f"tmp-checkpoint-{step}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    for name in SHARED if node == 0 else []:
        body = json.dumps({"step": step}) if name == "trainer_state.json" else f"{name} {step}"
        (tmp / name).write_text(body)
        time.sleep(pause)
    (tmp / f"rng_state_{node}.pth").write_text(f"rng {node} {step}")
    time.sleep(pause * (4 if node else 1))  # the slower nodes write on a while
    shutil.rmtree(root / f"checkpoint-{step}", ignore_errors=True)
    os.replace(tmp, root / f"checkpoint-{step}")
    print(f"node {node} saved checkpoint-{step}", flush=True)
