"""CLI start-up: `mncloud --help` against bare Python and `import sky`, in the same run.

`mncloud --help` must import neither torch nor SkyPilot; this prints how long it takes next to
the two baselines (median of several runs each) and the ratio to `import sky`.

    python bench/cli_startup.py [--repeat 5]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time


def _median_seconds(argv: list[str], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        subprocess.run(argv, check=True, capture_output=True)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    python = sys.executable
    bare = _median_seconds([python, "-c", "pass"], args.repeat)
    help_ = _median_seconds([python, "-m", "mncloud", "--help"], args.repeat)
    sky = _median_seconds([python, "-c", "import sky"], args.repeat)
    print(f"python -c pass        {bare:6.3f} s")
    print(f"mncloud --help        {help_:6.3f} s")
    print(f"import sky            {sky:6.3f} s")
    print(f"ratio help / import sky = {help_ / sky:.2f}x (lower is better)")


if __name__ == "__main__":
    main()
