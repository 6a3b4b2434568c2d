"""`python -m mncloud.backends.local supervise RUN_FOLDER`: the supervisor of one local run;
`... host NODE_DIR IDLE_S [PARENT]`: a warm node host (`warm.py`; with the supervisor's pid as
PARENT, a node's host for one run, `vm.py`)."""

from __future__ import annotations

import sys
from pathlib import Path


def main(argv: list[str]) -> int:
    if len(argv) in (3, 4) and argv[0] == "host":  # a warm node host (warmhost.py)
        from mncloud.backends.local.warmhost import serve

        parent = int(argv[3]) if len(argv) == 4 else None
        return serve(Path(argv[1]), float(argv[2]), parent)
    if len(argv) != 2 or argv[0] != "supervise":
        print(
            "usage: python -m mncloud.backends.local supervise RUN_FOLDER"
            " | host NODE_DIR IDLE_S [PARENT]",
            file=sys.stderr,
        )
        return 2
    from mncloud.backends.local.supervisor import Supervisor

    return Supervisor(Path(argv[1])).main()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
