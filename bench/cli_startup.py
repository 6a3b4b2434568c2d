"""CLI start-up: `mncloud --help` (and `mncloud up --help`) against bare Python and
`import sky`, in the same run.

`mncloud --help` must import neither torch nor SkyPilot, nor pydantic nor `mncloud.spec` (the
help text is plain data, `mncloud.options`); the goal (#42) is to stay within 0.3 s of a bare
`python -c pass`. The commands are run in turn, round by round, so a change in the machine's
load touches each alike; each figure is the median over the rounds.

    python bench/cli_startup.py [--repeat 9] [--no-sky] [--before /path/to/other/checkout]

`--before DIR` also times `mncloud --help` from another checkout (its tree first on
PYTHONPATH), in the same rounds: the change against the code before it.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time

#: Where the commands run: not a checkout (`python -m` and `-c` put the current folder first on
#: sys.path, which would hide PYTHONPATH's tree).
_ELSEWHERE = tempfile.gettempdir()
#: The most `mncloud --help` may take over a bare `python -c pass` (#42).
GOAL_S = 0.3


def _seconds(argv: list[str], env: dict[str, str] | None = None) -> tuple[float, float]:
    """Wall seconds and CPU seconds (user + system) of one run of `argv`."""
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run(argv, check=True, capture_output=True, env=env, cwd=_ELSEWHERE)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - used.ru_utime) + (after.ru_stime - used.ru_stime)


_IMPORT_CPU = (
    "import sys, time\nstart = time.process_time()\nimport mncloud.cli\n"
    "print(time.process_time() - start, len(sys.modules))"
)


def _import_cpu(env: dict[str, str] | None) -> tuple[float, int]:
    """CPU seconds `import mncloud.cli` takes in a fresh interpreter, and the modules loaded:
    steadier than wall time on a busy machine."""
    out = subprocess.run(
        [sys.executable, "-c", _IMPORT_CPU],
        check=True,
        capture_output=True,
        text=True,
        env=env,
        cwd=_ELSEWHERE,
    ).stdout.split()
    return float(out[0]), int(out[1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=9)
    parser.add_argument("--no-sky", action="store_true", help="skip the `import sky` baseline")
    parser.add_argument("--before", help="another checkout whose `mncloud --help` to time too")
    args = parser.parse_args()
    python = sys.executable
    commands = {
        "python -c pass": [python, "-c", "pass"],
        "mncloud --help": [python, "-m", "mncloud", "--help"],
        "mncloud up --help": [python, "-m", "mncloud", "up", "--help"],
    }
    if not args.no_sky:
        commands["import sky"] = [python, "-c", "import sky"]
    envs: dict[str, dict[str, str] | None] = dict.fromkeys(commands)
    if args.before:
        commands["mncloud --help (before)"] = commands["mncloud --help"]
        envs["mncloud --help (before)"] = {**os.environ, "PYTHONPATH": args.before}
    times: dict[str, list[tuple[float, float]]] = {name: [] for name in commands}
    for _ in range(args.repeat):
        for name, argv in commands.items():
            times[name].append(_seconds(argv, envs[name]))
    median = {name: statistics.median(w for w, _ in values) for name, values in times.items()}
    cpu = {name: statistics.median(c for _, c in values) for name, values in times.items()}
    bare = median["python -c pass"]
    for name, seconds in median.items():
        print(
            f"{name:24s} {seconds:6.3f} s median (+{seconds - bare:6.3f} s over bare python); "
            f"CPU {cpu[name]:6.3f} s (+{cpu[name] - cpu['python -c pass']:6.3f} s)"
        )
    for name in ("mncloud --help", "mncloud up --help"):
        over = median[name] - bare
        met = "met" if over <= GOAL_S else "NOT met"
        ratio = median[name] / bare
        print(f"{name}: {ratio:.1f}x bare python, +{over:.3f} s (goal +{GOAL_S} s: {met})")
    trees = {"now": None, **({"before": envs["mncloud --help (before)"]} if args.before else {})}
    for tree, env in trees.items():
        runs = [_import_cpu(env) for _ in range(args.repeat)]
        seconds, modules = statistics.median(c for c, _ in runs), runs[0][1]
        print(f"import mncloud.cli ({tree}): {seconds:.3f} s CPU median, {modules} modules")
    if args.before:
        before = median["mncloud --help (before)"]
        print(f"mncloud --help now / before = {median['mncloud --help'] / before:.2f}x")
    if "import sky" in median:
        print(f"ratio help / import sky = {median['mncloud --help'] / median['import sky']:.2f}x")


if __name__ == "__main__":
    main()
