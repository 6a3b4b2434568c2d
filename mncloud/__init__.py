"""mncloud: multi-node PyTorch training on the cheapest cloud, resumable through preemptions.

The listing reads as the request's way (CONTRIBUTING.md has the map; `tests/test_layering.py`
the order of the rooms):

    errors.py, constants.py, layout.py   the ground floor: error types, shared names, paths
    redact.py      what a credential looks like: refused in `--env`, scrubbed from records
    options.py     the job's options as plain data: name, type, default, bounds (help reads it)
    catalog/       SkyPilot's facts, cached: offers, prices, enabled clouds, GPU names
    storage/       one Bucket interface over S3, GCS and a directory; the checkpoint layout
    telemetry/     the ranks' telemetry segments (steps, metrics, events) and their readers
    export/        a complete checkpoint → safetensors or a torch file, verified
    train/         what a training script imports (checkpoints, notices, node recovery)
    doctor/        checks before launch and at job start on every node
    spec/          JobSpec: the job the user asked for, validated once; `spec/launch.py`:
                   LaunchOptions, how it is planned and run (and DeadlineOptions)
    request.py     flags over `mncloud.yaml`, built into a JobSpec
    plan/          the ranked plan: offers timed and priced by expected cost to finish
    deadline/      pure deadline policies, replays and their pricing
    render/        JobSpec (+ plan) → the SkyPilot task (templates/)
    records/       run records: what ran, how, where, at what price
    backends/      the engine interface, the local and SkyPilot engines, the registry
    launch.py      the spine: plan → render → bucket → record → backend
    control/       the deadline controller
    operate/       a run as `status`, `logs`, `down` see it, through the Backend interface
    ui/            `mncloud ui`, a read-only web view
    cli/           the `mncloud` command, one module per command group
    __main__.py    `python -m mncloud`
"""

from __future__ import annotations

__version__ = "0.1.0"
