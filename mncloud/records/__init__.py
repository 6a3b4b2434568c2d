"""Run records: what ran (lineage), how it was launched, where and at what price, how fast.

One module per job; import the module that holds a name (`from mncloud.records.store import
create_record`): the package itself exports nothing, so every import names its real edge.

    model.py      RunRecord, Event, GitInfo: the record itself (pydantic)
    lineage.py    git capture (commit, diff hash and copy, untracked files), packages
    index.py      one file summarising every record here: newest of a run, listings
    store.py      the locked record store (this machine + the bucket copy), events
    ledger.py     billed segments, cost summary, spot hazards learned for `plan --learn`
    goodput.py    the goodput ledger: billed node-seconds and dollars split by what they bought
    rerun.py      rebuild a recorded run's tree in a worktree, with its spec and options
    mlflowrun.py  the run's one MLflow run, created at `up` over MLflow's REST API
    trackers.py   the tracker runs' links, and mncloud's figures sent at each attempt's end
    wandbfigures.py  those figures into the W&B run (online API, or an offline run beside)

Secret redaction is `mncloud.redact` (the ground floor: `request` refuses credential-shaped
`--env` values with it); the ranks' telemetry segments are `mncloud.telemetry`.
"""
