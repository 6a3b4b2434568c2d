"""The cloud fault soak's mutation check, long form (issue #58): the fix × seeds table.

    python bench/soak_mutations.py [--seeds 10] [--faults 20] [--fix NAME ...] [--json]

Each fix of `tests/guarded_fixes.diff` is taken out of a copy of the source in turn, and its
soak (`tests/mutations.py`) runs there on seeds 0..N-1 of `--faults` faults each, drawn from
every fault kind; its own test runs there too and must fail. Then each soak once more with
every fix in, the control: no seed may report anything. Prints a markdown table, one row per
fix (a cell per seed: `x` caught, `.` not), for docs/benchmarks.md; `--json`: one JSON line per
row instead. Exit 1 when a control seed found something, a fix was missed in some seed, or
its own test passed. An entry no soak reaches yet (soak `none`) runs its own test only. One
soak process at a time (run it under `nice`).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.mutations import OWN_TEST_ONLY, SOAKS, check, fixes


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--faults", type=int, default=20)
    parser.add_argument("--fix", action="append", help="only these fixes (and no control)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    seeds = list(range(args.seeds))
    chosen = {n: f for n, f in fixes().items() if not args.fix or n in args.fix}
    rows, bad = [], False
    with tempfile.TemporaryDirectory(prefix="soak-mutations-") as scratch:
        for n, (name, fix) in enumerate(chosen.items()):
            began = time.monotonic()
            verdict = check(fix, fix.soak, seeds, args.faults, Path(scratch) / f"fix-{n}")
            soaked = fix.soak != OWN_TEST_ONLY  # else its own test only (`fix.unsoaked`)
            missed = [s for s in seeds if soaked and not verdict.caught.get(s)]
            bad |= bool(missed) or not verdict.own_test_failed
            caught = len(seeds) - len(missed) if soaked else None  # (none: its own test only)
            rows.append({"fix": name, "soak": fix.soak, "caught": caught,
                         "missed": missed, "own_test_failed": verdict.own_test_failed,
                         "cells": "".join("." if s in missed else "x" for s in seeds)
                         if soaked else "own test only",
                         "first": next((v for v in verdict.caught.values() if v), ""),
                         "seconds": round(time.monotonic() - began)})  # fmt: skip
            _say(rows[-1], args.json)
        for n, soak in enumerate(() if args.fix else SOAKS):
            began = time.monotonic()
            verdict = check(None, soak, seeds, args.faults, Path(scratch) / f"none-{n}")
            found = [s for s in seeds if verdict.caught.get(s)]
            bad |= bool(found)
            rows.append({"fix": f"(none: {soak})", "soak": soak, "caught": len(found),
                         "missed": [], "own_test_failed": None,
                         "cells": "".join("x" if s in found else "." for s in seeds),
                         "first": next((v for v in verdict.caught.values() if v), ""),
                         "seconds": round(time.monotonic() - began)})  # fmt: skip
            _say(rows[-1], args.json)
    if not args.json:
        print(_table(rows, len(seeds), args.faults))
    return 1 if bad else 0


def _say(row: dict[str, object], as_json: bool) -> None:
    if as_json:
        print(json.dumps(row), flush=True)
    else:
        said = f"{row['fix']}: {row['cells']} own test failed: {row['own_test_failed']}"
        print(f"{said} ({row['seconds']} s) {str(row['first'])[:120]}", file=sys.stderr)


def _table(rows: list[dict[str, object]], seeds: int, faults: int) -> str:
    head = [f"| fix taken out | soak | seeds 0–{seeds - 1} ({faults} faults each) | caught "
            "| own test |", "|---|---|---|---|---|"]  # fmt: skip
    own = {True: "fails", False: "PASSES", None: "—"}
    lines = [f"| {r['fix']} | {r['soak']} | `{r['cells']}` | {_caught(r['caught'], seeds)} | "
             f"{own[r['own_test_failed']]} |" for r in rows]  # type: ignore[index]  # fmt: skip
    return "\n".join(head + lines)


def _caught(caught: object, seeds: int) -> str:
    """`caught/seeds`, or — for a fix no soak reaches (its own test only)."""
    return "—" if caught is None else f"{caught}/{seeds}"


if __name__ == "__main__":
    sys.exit(main())
