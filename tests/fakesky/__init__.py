"""A fake of SkyPilot 0.14's client SDK that cannot drift from the real one unnoticed.

- **Bound to the real signatures.** Every faked call first binds its arguments to the real
  function's signature (`inspect.signature(real).bind`): a renamed or removed parameter is a
  TypeError in the test, as it would be against the real SDK.
- **The client's own work, for real.** `jobs.launch` runs what the real client does before it
  talks to the server (`sky/jobs/client/sdk.py`): `dag_utils.convert_entrypoint_to_dag`, the
  job name set on the DAG, `dag_utils.dump_dag_to_yaml_str` (a job group's multi-document
  YAML) into SkyPilot's own request body (`payloads.JobsLaunchBody`); the "server" then loads
  that YAML back (`dag_utils.load_dag_from_yaml_str`), as the API server does.
- **Answers through the wire.** What a request returns goes through SkyPilot's own server-side
  encoder, JSON, and the client's decoder (`sky/server/requests/serializers/`), so `sky.get`
  answers exactly the shape the real client gets (`jobs.queue_v2`: records, total, status
  counts, total before filters).
- **Stateful.** A managed-jobs table (id → name, owner, tasks, each task's `ManagedJobStatus`,
  `start_at` / `end_at` / `last_recovered_at`, and the seconds it held RUNNING) with
  increasing ids, and clusters. Cancel by `job_ids` moves live tasks to CANCELLING (PENDING
  straight to CANCELLED) and the `cancel_polls`-th next queue read to CANCELLED (a slow
  teardown: raise it). Cancel by `name` is modelled on `sky/jobs/utils.py`
  `cancel_job_by_name` and `sky/jobs/server/core.py` `cancel`: with several live jobs of that
  name nothing is cancelled and the request still returns None (the server's check for the
  message looks for other words than the message has), so the caller learns nothing; the
  message is kept in `fake.messages`.
- **Users.** Each job belongs to the user who launched it (`fake.user`, `fake.as_user(...)`);
  `jobs.queue_v2` lists only the caller's jobs unless `all_users=True`, and cancel by name or
  `all` only the caller's, as `sky/jobs/server/core.py` filters by `get_user_hash()`; cancel
  by id reaches any user's job (the workspace is the boundary).
- **Logins.** `fake.service_account(token, user, admin=...)` turns service-account tokens
  on: a client sending a token (`SKYPILOT_SERVICE_ACCOUNT_TOKEN`) is its user, whatever
  `SKYPILOT_USER_ID` says; a non-admin's `api_status`, `get` and `api_cancel` reach its own
  requests only, an admin sees another user's body as `null` (`auth`; held to the real
  server in `tests/test_sky_contract_auth.py`).
- **Scripts.** `fake.script(job_id, [...])` gives a job (or one task of a job group) the states
  it shows on successive queue reads: `ManagedJobStatus` values, or the events `ERROR` (the
  user's program exits 1: RECOVERING while `max_restarts_on_errors` of the job's own
  `job_recovery` allows, else FAILED) and `PREEMPT` (the VMs lost: RECOVERING). A task that
  leaves RECOVERING for RUNNING counts one recovery, as SkyPilot's `set_recovered_async`.
- **Clusters** (`up --cluster`, `exec`): `launch` and `exec` run the client's own work
  (`convert_entrypoint_to_dag`, the YAML into `LaunchBody` / `ExecBody`); the "server" keeps the
  cluster's `sky.status` record (UP, `autostop`, `to_down`), its jobs (`JobStatus`) and the YAML
  of each (`fake.cluster_yamls[name]`); `exec` on a cluster that is not UP fails as the server
  does. `autostop` sets the record's timer. Managed-job paths never call `launch`: their tests
  assert `not fake.called("launch")`.
- **Nothing else gets through.** Every other public function of `sky` and `sky.jobs` that
  would reach the API server raises `AssertionError("unfaked SkyPilot call sky.X")`.
  `sky.server.common.get_api_server_status` answers HEALTHY (UNHEALTHY once `unreachable`),
  so nothing probes a real port.
- **Faults.** `fake.answers[name] = value` (or an exception) overrides the model for every
  call of that name; `fake.fail(name, err, times)` fails the next requests (nothing done);
  `fake.lose(name, times)`: the server does the work and the client's wait for the answer
  raises `ApiServerConnectionError`; `fake.unreachable(after=...)` makes every call raise it.
- **Requests in flight.** `fake.held.add("jobs.launch")`: the "server" finishes such a request
  when someone waits for it (`sky.get`), when `fake.finish_in_flight()` is called, or on its
  own once `fake.finish_after` later requests reached the server, as a real server finishes a
  request whose client died; meanwhile `sky.api_status()` lists it under the server's name for
  it (`sky.jobs.launch`: `REQUEST_NAME_PREFIX`, `sky/server/requests/executor.py`) with its
  body. A job's row carries the YAML the client sent as `user_yaml` (SkyPilot's
  `original_user_yaml_content`).

- **Tokens** (`tokens.py`): a managed job with `api_server_access` gets a 3-day
  service-account token of its user where the server has service accounts
  (`job_tokens[job_id]`, `issue_token`), as `sky/jobs/server/core.py` gives one; a client
  that sends one past its expiry on the fake's clock gets `ApiServerAuthenticationError` (the
  server's 401), each refusal kept in `refused`.

- **Held to the real server** (`tests/test_sky_contract.py`, docs/guides/skypilot-contract.md):
  the same calls against SkyPilot's real API server, started offline, with the same
  assertions. So, as the server: `sky.api_status` lists every request (the finished ones with
  `all_status`), each its user's (the client's `SKYPILOT_USER_ID` where set, else `user`), the
  server's daemons among them; `sky.api_cancel` ends a request in flight CANCELLED and `sky.get`
  raises `RequestCancelled`; a request's error reaches the client through SkyPilot's exception
  serialization; `cloud_access = False` fails every launch with `NoCloudAccessError`;
  `jobs.queue_v2` and `jobs.cancel` fail with `ClusterNotUpError("No in-progress managed
  jobs.")` until a first managed job exists (no jobs controller); the client adds
  `SKYPILOT_API_SERVER_ENDPOINT` to a task with `api_server_access`.

Modules: `model` (the jobs table and how a task's state moves), `jobs` and `clusters` (the
server's answers), `server` (requests, faults, `install`), `auth` (logins and the scope of
each caller's requests), `tokens` (service-account tokens' expiry), `wire` (the real SDK and
codecs).
"""

from tests.fakesky.model import ERROR, LAPTOP, PREEMPT, Event, FakeJob, FakeTask, User
from tests.fakesky.server import FakeSky, install
from tests.fakesky.wire import server_name, strict_records

__all__ = [
    "ERROR", "LAPTOP", "PREEMPT", "Event", "FakeJob", "FakeSky", "FakeTask", "User", "install",
    "server_name", "strict_records",
]  # fmt: skip
