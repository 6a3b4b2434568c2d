"""`python -m mncloud.backends.local supervise RUN_FOLDER`: the supervisor of one local run."""

from __future__ import annotations

import sys
from pathlib import Path


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] != "supervise":
        print("usage: python -m mncloud.backends.local supervise RUN_FOLDER", file=sys.stderr)
        return 2
    from mncloud.backends.local.supervisor import Supervisor

    return Supervisor(Path(argv[1])).main()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
