"""The ranks' telemetry: what every training process appends, and what reads it back.

Torch-free and light (the training side imports it on every rank); it sits on the ground floor,
under `train` and `doctor` (which write it) and `records` (whose readers join it to a run):

    segments.py    a segment's format: its rows, its parse, the `Series` segments merge into
    rollup.py      each process's rollup (bounded) and the read through rollups and tails
    series.py      the segments ranks append to the run's bucket (steps, metrics, events)
    seriestail.py  a live series read as it grows (the local supervisor's polls)
    steps.py       per-rank step times and stragglers, off the segments
    curves.py      the metrics and step-time curves a run's page and `mncloud metrics` draw
"""
