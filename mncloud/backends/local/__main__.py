"""`python -m mncloud.backends.local supervise RUN_FOLDER`: the supervisor of one local run;
`... host NODE_DIR IDLE_S`: a warm node host of a `--cluster` run (`warm.py`)."""

from __future__ import annotations

import sys
from pathlib import Path


def main(argv: list[str]) -> int:
    if len(argv) == 3 and argv[0] == "host":  # a warm node host (warmhost.py)
        from mncloud.backends.local.warmhost import serve

        return serve(Path(argv[1]), float(argv[2]))
    if len(argv) != 2 or argv[0] != "supervise":
        print(
            "usage: python -m mncloud.backends.local supervise RUN_FOLDER | host NODE_DIR IDLE_S",
            file=sys.stderr,
        )
        return 2
    from mncloud.backends.local.supervisor import Supervisor

    return Supervisor(Path(argv[1])).main()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
