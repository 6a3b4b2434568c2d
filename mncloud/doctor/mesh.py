"""The preflight's word on a sharded run: does the newest checkpoint's mesh match this run?

A checkpoint of sharded state (FSDP2 / HSDP) records the mesh it was saved on (the manifest's
`extra.mesh`, `mncloud.train`). A resume on another number of ranks still works (DCP reshards
model and optimizer), but the user should know: the step time changes, and the global batch is
kept only by a script that takes its accumulation from `mncloud.train.accumulation_steps`. And
`$MNCLOUD_PARALLEL=hsdp` on one node has nothing to replicate across. Warnings, not failures:
the run goes on.
"""

from __future__ import annotations

from mncloud.errors import MncloudError


def mesh_warnings(uri: str | None, nodes: int, per_node: int, parallel: str | None) -> list[str]:
    """One line for each way the run's layout differs from what it was asked or saved with."""
    lines: list[str] = []
    ranks = nodes * per_node
    if (parallel or "").lower() == "hsdp" and nodes < 2:
        lines.append("preflight: warning: hsdp on 1 node has nothing to replicate across; "
                     "the script gets an error (use --parallel fsdp)")  # fmt: skip
    if not uri or per_node < 1:
        return lines
    from mncloud.storage import CheckpointStore

    try:
        store = CheckpointStore(uri, retry_seconds=5)
        step, _ = store.latest()
        if step is None:
            return lines
        manifest = store.read_manifest(step)
    except MncloudError:  # the bucket check reports an unusable bucket
        return lines
    mesh = manifest.extra.get("mesh")
    if isinstance(mesh, dict) and manifest.world_size != ranks:
        shape = " × ".join(str(n) for n in mesh.get("shape") or [manifest.world_size])
        lines.append(
            f"preflight: warning: checkpoint step {step} was saved sharded over "
            f"{manifest.world_size} ranks (mesh {shape}); this run has {nodes} node(s) × "
            f"{per_node} = {ranks}: it is resharded on load, and the global batch holds only "
            "if the script takes its accumulation from mncloud.train.accumulation_steps"
        )
    return lines
