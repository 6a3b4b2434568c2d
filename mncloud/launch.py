"""The spine of `mncloud up`: spec → plan → render → bucket → record → backend. Never prints.

`up`, `render --plan`, `rerun` and the deadline controller all come through here, so a launch
is the same whoever asks for it. What the CLI shows (the plan table, the question before money
is spent, bucket notes) reaches it through two callbacks: `approve(plan)` and `notify(text)`.

A run name is a handle on one run. Launching a name that already has a run is refused unless
the caller says what to do with the earlier run (`Existing`):

- RESUME: continue from its newest complete checkpoint (the checkpoint location is the same).
- REPLACE: start over from step 0. Checkpoints are never deleted: a local run's checkpoint
  folder is set aside (`checkpoints.replaced-<time>`); a bucket that still holds checkpoints
  for the name is refused, since the new run would resume from them.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mncloud import layout
from mncloud.errors import MncloudError, SpecError
from mncloud.spec.launch import LaunchOptions, PlanOptions

if TYPE_CHECKING:
    from mncloud.backends.base import Backend, RunStatus
    from mncloud.plan import LearnedHazard, Plan, PlanRequest
    from mncloud.plan.model import ModelInputs
    from mncloud.plan.stepmodel import Workload
    from mncloud.render import RenderedTask
    from mncloud.spec import JobSpec


class LaunchCancelled(MncloudError):
    """The user declined the plan; nothing was launched."""


class Existing(str, Enum):
    """What to do when the run name already has a run."""

    REFUSE = "refuse"
    RESUME = "resume"
    REPLACE = "replace"


@dataclass(frozen=True)
class Prepared:
    """A request made concrete: the spec as launched, its plan (None for local) and task."""

    spec: JobSpec
    plan: Plan | None
    task: RenderedTask
    backend: str


@dataclass(frozen=True)
class Launched:
    """What a launch did: the prepared task, the run id of its record and the first status."""

    prepared: Prepared
    run_id: str | None
    status: RunStatus


def learned_hazards() -> list[LearnedHazard]:
    """Spot hazards learned from this machine's run records, blended with the priors."""
    from mncloud.plan import learn_hazards
    from mncloud.records.ledger import observed_spot_hazard

    return learn_hazards(observed_spot_hazard())


def model_inputs(
    options: PlanOptions, script: Path | None = None, args: list[str] | None = None
) -> ModelInputs:
    """What the planning options point at, read (`plan` and `up` alike): the step's cost (with
    a script, its profile if fresh), `--learn`'s records, `--hazards-from`'s traces."""
    from mncloud.plan.hazards import hazards_from_files
    from mncloud.plan.model import ModelInputs
    from mncloud.plan.profile import resolve_workload

    workload, source = resolve_workload(options, script, args)
    measured: dict[str, float] = {}
    if options.learn:
        workload, measured, source = _learned_hardware(workload, source, script, args)
    return ModelInputs(
        workload=workload,
        workload_source=source,
        learned=learned_hazards() if options.learn else [],
        measured_busbw=measured,
        traces=hazards_from_files(options.hazards_from) if options.hazards_from else [],
    )


def _learned_hardware(
    workload: Workload | None, source: str, script: Path | None, args: list[str] | None
) -> tuple[Workload | None, dict[str, float], str]:
    """`--learn`: bandwidths earlier runs' preflights measured, and this script's efficiency
    per GPU type from their step times (`plan.learned`)."""
    from mncloud.plan import learned
    from mncloud.records.ledger import observed_runs

    observed = observed_runs()
    busbw = learned.node_busbw(observed)
    if workload is None or script is None or not observed:
        return workload, busbw, source
    found = learned.mfu_by_gpu(workload, observed, str(script.resolve()), list(args or []))
    if found:
        shown = ", ".join(f"{name} {mfu:.2f}" for name, mfu in sorted(found.items()))
        source += f"; MFU measured by earlier runs: {shown}"
        workload = workload.model_copy(update={"mfu_by_gpu": found})
    return workload, busbw, source


def plan_request(spec: JobSpec, options: PlanOptions) -> PlanRequest:
    """The planner's request for a cloud job: the spec's hardware plus the model options."""
    from mncloud.plan import PlanRequest

    inputs = model_inputs(options, spec.script, list(spec.script_args))
    return PlanRequest.from_spec(spec, options, inputs)


def prepare(
    spec: JobSpec,
    options: LaunchOptions,
    *,
    run_id: str | None = None,
    approve: Callable[[Plan], bool] | None = None,
) -> Prepared:
    """Plan (clouds only) and render; `approve` sees the plan before anything is rendered."""
    from mncloud.render import render

    plan = None
    backend = backend_name(spec)
    if options.preflight_always and not spec.preflight:
        raise SpecError(
            "--preflight-always runs the preflight at every launch and --no-preflight skips it:"
            " give one of them"
        )
    if not spec.is_local:
        if "local" in spec.clouds:
            raise SpecError("--cloud local runs on this machine alone; do not mix it with clouds")
        from mncloud.plan import make_plan
        from mncloud.render import jobgroup

        if jobgroup.applies(spec):
            jobgroup.require_bucket(spec)  # before the plan is shown and approved

        plan = make_plan(plan_request(spec, options))
        if approve is not None and not approve(plan):
            raise LaunchCancelled("not launched")
    task = render(spec, plan=plan, template=options.template, run_id=run_id)
    return Prepared(spec=spec, plan=plan, task=task, backend=backend)


def launch(
    spec: JobSpec,
    options: LaunchOptions | None = None,
    *,
    dryrun: bool = False,
    existing: Existing = Existing.REFUSE,
    approve: Callable[[Plan], bool] | None = None,
    notify: Callable[[str], None] = lambda _text: None,
    run_id: str | None = None,
    record_events: bool = True,
) -> Launched:
    """Plan, render, prepare the bucket, write the run record and hand the task to a backend.

    `approve(plan)` may decline (LaunchCancelled); `notify(text)` receives notes and warnings
    (a bucket created, egress across regions). `run_id`: the record's id, chosen by the caller
    (the deadline controller journals it before the launch, so a restarted controller finds
    the launch by it); a new one when None. `record_events=False`: the caller writes the
    record's launch and end events itself (the deadline controller). Raises MncloudError on
    bad input.
    """
    from mncloud.backends.base import LaunchRequest
    from mncloud.backends.registry import get_backend, record_backend

    options = options or LaunchOptions()
    spec = get_backend(backend_name(spec)).settled(spec)
    if options.cluster and not spec.is_local:
        spec = cluster_spec(spec)
    if not dryrun:
        settle_existing(spec, existing, onto_cluster=bool(options.cluster) and not spec.is_local)
    if existing is not Existing.REPLACE:
        check_resume_fits(spec)
    run_id = None if dryrun else run_id or _new_run_id(spec.name)
    if run_id is not None and record_events:  # `up`, not a deadline controller's relaunch
        from mncloud.records.mlflowrun import with_mlflow_run

        spec = with_mlflow_run(spec, run_id, notify, resume=existing is Existing.RESUME)
    prepared = prepare(spec, options, run_id=run_id, approve=approve)
    if prepared.plan is not None and spec.bucket is not None and not dryrun:
        from mncloud.storage import prepare_bucket

        choice = prepared.plan.choice
        state, warning = prepare_bucket(spec.bucket, choice.cloud, choice.region, notify)
        if warning:
            from mncloud.storage import egress_warning

            size = newest_checkpoint_gb(spec.ckpt_uri)  # the warning names a launch's $
            warning = egress_warning(state, choice.cloud, choice.region, size) or warning
            notify(f"warning: {warning}")
        _clear_leftover_stop(spec)
    if run_id is not None:
        from mncloud.records.store import create_record

        record_backend(spec.name, prepared.backend)
        create_record(
            spec,
            prepared.task,
            prepared.plan,
            prepared.backend,
            run_id=run_id,
            launch_options=options.model_dump(mode="json"),
        )
    backend: Backend = get_backend(prepared.backend)
    request = LaunchRequest(
        spec=spec,
        task=prepared.task,
        plan=prepared.plan,
        options=options,
        run_id=run_id,
        dryrun=dryrun,
        record_events=record_events,
    )
    return Launched(prepared=prepared, run_id=run_id, status=backend.launch(request))


def exec_run(
    name: str,
    script: Path | None = None,
    script_args: list[str] | None = None,
    *,
    restart: bool = False,
) -> Launched:
    """`mncloud exec`: run `name`'s task again on the nodes it still holds (`Backend.exec`).

    The task is the one `up` rendered and recorded, unless `script` or `script_args` change
    it (then it is rendered again, without the plan: the cluster is already chosen). The
    script resumes from the newest complete checkpoint; `restart` sets them aside first, as
    `up --replace` does (a bucket that holds some is refused: mncloud never deletes them).
    """
    from mncloud.backends.base import LaunchRequest
    from mncloud.backends.registry import backend_name_of, get_backend
    from mncloud.records.store import load_current
    from mncloud.render import render, rendered_from_yaml
    from mncloud.spec import JobSpec
    from mncloud.spec.launch import LaunchOptions

    backend: Backend = get_backend(backend_name_of(name))  # RunNotFoundError: unknown name
    record = load_current(name)
    spec = JobSpec.model_validate(record.spec)
    options = LaunchOptions.model_validate(record.launch_options or {})
    if script is not None or script_args is not None:
        spec = _exec_spec(spec, script, script_args)
        task = render(spec, template=options.template, run_id=record.run_id)
    else:
        task = rendered_from_yaml(record.task_yaml)
    request = LaunchRequest(spec=spec, task=task, options=options, run_id=record.run_id)
    if restart:  # only once the run is over: its checkpoints must not move under it
        state = backend.status(name).state
        if not state.is_final:
            raise SpecError(
                f"run {name!r} is still {state.value}; wait for it (`mncloud logs {name} -f`) "
                f"or stop it with `mncloud down {name}`, then exec"
            )
        _set_checkpoints_aside(spec)
    prepared = Prepared(spec=spec, plan=None, task=task, backend=backend.name)
    return Launched(prepared=prepared, run_id=record.run_id, status=backend.exec(request))


def _exec_spec(spec: JobSpec, script: Path | None, script_args: list[str] | None) -> JobSpec:
    """The spec of an exec that names another script (inside the run's project folder, which
    is what the nodes have) or other arguments."""
    changes: dict[str, Any] = {}
    if script_args is not None:
        changes["script_args"] = list(script_args)
    if script is not None:
        path = script.expanduser().resolve()
        if not path.is_file():
            raise SpecError(f"script {str(script)!r} does not exist")
        if not path.is_relative_to(spec.workdir):
            raise SpecError(
                f"script {str(script)!r} is outside the run's project folder {spec.workdir} "
                "(the folder synced to its nodes); pick a script inside it"
            )
        changes["script"] = path
    return spec.updated(**changes)


def cluster_spec(spec: JobSpec) -> JobSpec:
    """`up --cluster`: a plain cluster has no recovery, so it runs on-demand unless --spot is
    asked for, and as one gang (`--recovery node` needs a managed job group)."""
    from mncloud.render import jobgroup
    from mncloud.spec import SpotPolicy

    if jobgroup.applies(spec):
        raise SpecError(
            "--cluster runs the nodes as one gang on one cluster; --recovery node needs a "
            "managed job group: add --recovery gang, or drop --cluster"
        )
    return spec.updated(spot=SpotPolicy.ON_DEMAND) if spec.spot is SpotPolicy.EITHER else spec


def _clear_leftover_stop(spec: JobSpec) -> None:
    """A stop request a `down` left behind (it died before clearing it) must not stop this
    launch's nodes (see `storage/stoprequest.py`)."""
    from mncloud.storage import CheckpointStore
    from mncloud.storage.stoprequest import clear_stop_request

    if spec.ckpt_uri:
        with contextlib.suppress(MncloudError):
            clear_stop_request(CheckpointStore(spec.ckpt_uri, retry_seconds=5))


def _new_run_id(name: str) -> str:
    from mncloud.records.store import new_run_id

    return new_run_id(name)


def backend_name(spec: JobSpec) -> str:
    """The backend that runs `spec`: local on `--cloud local`, else SkyPilot."""
    return "local" if spec.is_local else "skypilot"


def settle_existing(spec: JobSpec, existing: Existing, *, onto_cluster: bool = False) -> None:
    """Refuse to launch over an earlier run of the same name unless told what to do with it
    (`onto_cluster`: the launch goes onto the run's own cluster, `up --cluster`)."""
    from mncloud.backends.base import RunState
    from mncloud.backends.registry import backend_for_run, known_runs

    if spec.name not in known_runs():
        return
    status = backend_for_run(spec.name).status(spec.name)
    if not status.state.is_final:
        raise SpecError(
            f"run {spec.name!r} is still {status.state.value}; stop it with "
            f"`mncloud down {spec.name}` or pick another --name"
        )
    if existing is Existing.REFUSE:
        raise SpecError(
            f"a run named {spec.name!r} exists ({status.state.value}); pass --resume to continue "
            "from its newest complete checkpoint, --replace to start over (local checkpoints "
            "are set aside, never deleted; a bucket that holds some is refused), or another --name"
        )
    if status.state is RunState.FAILED and not (onto_cluster and _ran_on_cluster(spec.name)):
        _down_what_is_left(spec.name)
    if existing is Existing.REPLACE:
        _set_checkpoints_aside(spec)


def _down_what_is_left(name: str) -> None:
    """A failed run may still have live parts: a job group whose one node FAILED keeps its
    other nodes training and billing. They are cancelled before a launch on the same
    checkpoints (two gangs on one prefix otherwise); a backend that ends its own runs
    (local) has nothing left."""
    from mncloud.backends.registry import backend_for_run

    backend = backend_for_run(name)
    if not backend.records_own_events:
        backend.down(name, notice_s=0.0, by="mncloud up (the failed launch's live parts)")


def _ran_on_cluster(name: str) -> bool:
    """The run's newest launch was `up --cluster`: a relaunch onto that cluster (still up, its
    job ended) reuses it and closes the earlier record (`record_superseded`), tears nothing down."""
    from mncloud.records.store import load_current

    try:
        return bool(load_current(name).launch_options.get("cluster"))
    except MncloudError:
        return False


def check_resume_fits(spec: JobSpec) -> None:
    """Refuse (SpecError, one line) a launch that would resume from a checkpoint another model
    wrote: the newest complete step's shapes against those of the script's fresh profile (the
    only place its model is known before launch). Without a profile or recorded shapes the
    first load refuses instead (`mncloud.train.ModelMismatch`)."""
    from mncloud.plan.profile import Freshness, find
    from mncloud.storage import CheckpointStore
    from mncloud.storage.shapes import SHAPES_KEY, shape_mismatch

    profile, freshness = find(spec.script, list(spec.script_args))
    uri = spec.ckpt_uri
    if uri is None and spec.is_local:
        uri = layout.local_ckpt_dir(spec.name).as_uri()
    if profile is None or freshness is not Freshness.FRESH or not profile.shapes or not uri:
        return
    try:
        store = CheckpointStore(uri, retry_seconds=5)
        step, _ = store.latest()
        saved = store.read_manifest(step).extra.get(SHAPES_KEY) if step is not None else None
    except MncloudError:  # an unreadable bucket is the bucket check's to report
        return
    if step is not None and isinstance(saved, dict) and saved:
        line = shape_mismatch(saved, profile.shapes, step=step,
                              where=f"{spec.script.name} (its profile)")  # fmt: skip
        if line is not None:
            raise SpecError(line)


def _set_checkpoints_aside(spec: JobSpec) -> None:
    """Before a fresh start: move a local run's checkpoints aside; refuse over a bucket's."""
    if spec.bucket is None:
        folder = layout.local_ckpt_dir(spec.name)
        if folder.is_dir() and any(folder.iterdir()):
            folder.rename(layout.replaced_ckpt_dir(spec.name, time.strftime("%Y%m%d-%H%M%S")))
        return
    from mncloud.storage import CheckpointStore

    uri = layout.ckpt_uri(spec.bucket, spec.name)
    steps = CheckpointStore(uri).steps()
    if steps:
        raise SpecError(
            f"--replace starts from step 0, but {uri} holds {len(steps)} checkpoint(s) the new "
            f"run would resume from; mncloud never deletes them: remove them with `mncloud ckpt "
            f"rm {uri} STEP`, or pick another --name"
        )


def newest_checkpoint_gb(ckpt_uri: str | None) -> float | None:
    """GB of the newest complete checkpoint under `ckpt_uri` (what a launch elsewhere reads
    from the bucket), or None when there is none or the bucket cannot be listed now."""
    from mncloud.storage import CheckpointStore

    if not ckpt_uri:
        return None
    try:
        steps = [s for s in CheckpointStore(ckpt_uri, retry_seconds=2.0).steps() if s.complete]
    except Exception:  # best effort: only a warning's figure depends on it
        return None
    return steps[-1].size / 1e9 if steps else None
