"""The engines that run a rendered task, behind one interface.

    base.py      the `Backend` interface and what it returns (`RunStatus`, `RunState`, …)
    registry.py  engines by name (dotted paths, imported when asked for), which engine owns a run
    local/       this machine: N simulated nodes running real torchrun
    skypilot/    the clouds, through SkyPilot's managed jobs (and `--cluster`'s plain clusters)

Importing this package imports no engine (SkyPilot alone takes seconds to import).
"""
