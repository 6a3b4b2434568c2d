"""SkyPilot's exceptions → one actionable `BackendError` line (the cause and what to do)."""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator

from mncloud.errors import BackendError, MncloudError, RunNotFoundError
from mncloud.redact import Redactor

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
"""Terminal colour and cursor codes, which SkyPilot puts in its messages and logs."""


def one_line(err: BaseException | str, limit: int = 300) -> str:
    """`err` as one line without terminal codes or credential-shaped text (SkyPilot names its
    API server's URL, `user:password@` included), cut to `limit` characters."""
    text = Redactor().scrub(" ".join(ANSI.sub("", str(err)).split()))
    return text if len(text) <= limit else text[: limit - 1] + "…"


def translate_error(err: BaseException, action: str) -> MncloudError:
    """One actionable line for an exception raised by SkyPilot while doing `action`."""
    from sky import exceptions as sx

    cause = one_line(err) or type(err).__name__
    if isinstance(err, MncloudError):
        return err
    if isinstance(err, sx.ApiServerConnectionError):
        return BackendError(
            f"cannot {action}: SkyPilot's API server is unreachable ({cause}); start one with "
            "`sky api start` or check `sky api info`"
        )
    if isinstance(err, sx.ApiServerAuthenticationError):
        return BackendError(  # the laptop cannot ask what runs: say nothing was changed
            f"cannot {action}: SkyPilot's API server wants a login (an expired token answers "
            "so); nothing was done and whatever runs there runs on: `sky api login`, then the "
            "same command again"
        )
    if isinstance(err, sx.NoCloudAccessError):
        return BackendError(
            f"cannot {action}: SkyPilot has no cloud enabled ({cause}); run `sky check` and set "
            "up credentials for at least one cloud"
        )
    if isinstance(err, (sx.InvalidCloudCredentials, sx.CloudUserIdentityError)):
        return BackendError(
            f"cannot {action}: cloud credentials rejected ({cause}); run `sky check` to see which"
        )
    if isinstance(err, (sx.ResourcesUnavailableError, sx.ProvisionPrechecksError)):
        return BackendError(f"cannot {action}: no capacity ({cause}); {_capacity_advice(cause)}")
    if isinstance(err, sx.ResourcesMismatchError):
        return BackendError(
            f"cannot {action}: a cluster of that name exists with other resources ({cause}); "
            "`mncloud down` it or pick another --name"
        )
    if isinstance(err, sx.ClusterDoesNotExist):
        return RunNotFoundError(f"cannot {action}: SkyPilot has no such cluster ({cause})")
    if isinstance(err, sx.ClusterNotUpError):
        return BackendError(
            f"cannot {action}: the cluster is not up ({cause}); see `mncloud status`"
        )
    if isinstance(err, sx.NotSupportedError):
        return BackendError(f"cannot {action}: SkyPilot does not support this ({cause})")
    if isinstance(err, sx.PermissionDeniedError):
        return BackendError(f"cannot {action}: permission denied by SkyPilot ({cause})")
    return BackendError(f"cannot {action}: SkyPilot: {type(err).__name__}: {cause}")


def no_jobs_controller(err: BaseException) -> bool:
    """Whether `err` is SkyPilot's answer to a managed-jobs query (`jobs.queue_v2`,
    `jobs.cancel`) on an API server that never launched a managed job: it has no jobs
    controller to ask, and says so with `ClusterNotUpError("No in-progress managed jobs.")`
    (0.14.1, held by `tests/test_sky_contract.py`). An empty queue, not an unreachable one; a
    stopped or unreachable controller says other words and stays an error."""
    from sky import exceptions as sx
    from sky.utils import controller_utils

    hint = controller_utils.Controllers.JOBS_CONTROLLER.value.default_hint_if_non_existent
    return isinstance(err, sx.ClusterNotUpError) and one_line(err) == one_line(hint)


def _capacity_advice(cause: str) -> str:
    if "quota" in cause.lower():
        return "request a quota increase, or try another --region / --cloud"
    return "try another --region or --cloud, --on-demand instead of spot, or later"


@contextlib.contextmanager
def sky_errors(action: str, keep: tuple[type[BaseException], ...] = ()) -> Iterator[None]:
    """Turn whatever SkyPilot raises inside the block into one BackendError line; the
    exception types in `keep` pass through for the caller to handle."""
    try:
        yield
    except (KeyboardInterrupt, MncloudError, *keep):
        raise
    except Exception as err:
        raise translate_error(err, action) from None
