"""Retrying transient storage failures, with tenacity, for up to a time budget.

One layer retries: the SDKs' own retries are kept short (botocore: one quick retry inside a
call; google-cloud-storage: none), and `call_with_retry` keeps trying transient failures
(connection refused or reset, timeouts, 5xx, throttling) with jittered exponential backoff
until `budget` seconds have passed (default 60 s, or `MNCLOUD_STORAGE_RETRY_SECONDS`), then
raises `StorageUnreachable` (a `StorageError`: the storage did not answer, an outage rather
than a refusal; the preflight exits `STORAGE_OUTAGE_EXIT_CODE` for it). A permanent failure
(no such bucket, access denied, no credentials) raises at once, and so does a request the SDK
refused before sending it (botocore's `ParamValidationError` for a bucket name it rejects, a
`ValueError` from google-cloud-storage): the same call would be refused again, so it is never
retried (`refused_locally`).

The jitter draws from a private generator, and the SDKs' module-level `random` is pointed at
it too (`isolate_sdk_random`): they draw from the global `random` in upload threads, at
moments that depend on timing, which would perturb a training script's own Python RNG stream
and break bitwise-exact resume.
"""

from __future__ import annotations

import importlib
import logging
import os
import random
from collections.abc import Callable, Iterator
from typing import TypeVar

from tenacity import (
    RetryCallState,
    RetryError,
    Retrying,
    retry_if_exception_type,
    stop_before_delay,
    wait_exponential,
)

from mncloud.constants import STORAGE_RETRY_SECONDS_ENV
from mncloud.errors import StorageError

log = logging.getLogger("mncloud.storage")

T = TypeVar("T")

DEFAULT_RETRY_SECONDS = 60.0
MAX_BACKOFF_SECONDS = 8.0

#: Classifies an SDK error: None for transient (retry), else the message of a permanent one.
Classify = Callable[[BaseException], "str | None"]


class TransientStorageError(StorageError):
    """A failure worth retrying (server down, timeout, throttling)."""


class StorageUnreachable(StorageError):
    """Transient failures until the retry budget ran out: the storage did not answer (an
    outage), where a permanent failure (denied, no such bucket) is a plain StorageError."""


def retry_seconds_from_env(default: float = DEFAULT_RETRY_SECONDS) -> float:
    """The retry budget from `MNCLOUD_STORAGE_RETRY_SECONDS`, else `default`."""
    raw = os.environ.get(STORAGE_RETRY_SECONDS_ENV)
    if not raw:
        return default
    try:
        return max(0.0, float(raw))
    except ValueError:
        raise StorageError(f"{STORAGE_RETRY_SECONDS_ENV}={raw!r} is not a number") from None


_RNG = random.Random()
_backoff = wait_exponential(multiplier=0.25, max=MAX_BACKOFF_SECONDS)


def _jittered_backoff(state: RetryCallState) -> float:
    """0.25 s, 0.5 s, … up to 8 s, each scaled by a factor in [0.5, 1.5) from `_RNG`."""
    return _backoff(state) * (0.5 + _RNG.random())


def _log_retry(what: str) -> Callable[[RetryCallState], None]:
    def before_sleep(state: RetryCallState) -> None:
        err = state.outcome.exception() if state.outcome else None
        sleep = state.next_action.sleep if state.next_action else 0.0
        log.warning("%s failed (%s); retrying in %.1fs", what, err, sleep)

    return before_sleep


def call_with_retry(op: Callable[[], T], *, what: str, classify: Classify, budget: float) -> T:
    """Run `op`, retrying transient failures for up to `budget` seconds.

    `classify(err)` returns None for a transient error or a message for a permanent one (then
    StorageError with it). A StorageError raised by `op` passes through, except a
    TransientStorageError, which is retried.
    """

    def attempt() -> T:
        try:
            return op()
        except StorageError:
            raise
        except Exception as err:  # classified here; the SDKs raise many unrelated types
            permanent = classify(err)
            if permanent is not None:
                raise StorageError(f"{what}: {permanent}") from err
            raise TransientStorageError(short_error(err)) from err

    retrying = Retrying(
        stop=stop_before_delay(budget),
        wait=_jittered_backoff,
        retry=retry_if_exception_type(TransientStorageError),
        before_sleep=_log_retry(what),
    )
    try:
        return retrying(attempt)
    except RetryError as err:
        attempts = err.last_attempt.attempt_number
        raise StorageUnreachable(
            f"{what}: still failing after {attempts} attempts over {budget:.0f}s "
            f"({err.last_attempt.exception()}); is the storage endpoint reachable?"
        ) from None


_SDK_MODULES = {
    "s3": ("s3transfer", "s3transfer.utils", "botocore.retries.standard", "botocore.retryhandler",
           "botocore.utils", "urllib3.util.retry"),
    "gs": ("google.resumable_media._upload", "google.resumable_media._helpers",
           "google.cloud.storage._media._upload", "google.cloud.storage._media._helpers",
           "google.api_core.retry.retry_base", "google.auth._exponential_backoff",
           "urllib3.util.retry"),
}  # fmt: skip


def isolate_sdk_random(kind: str) -> None:
    """Point the SDK modules' `random` (kind `s3` or `gs`) at a private generator."""
    for name in _SDK_MODULES[kind]:
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue
        if getattr(module, "random", None) is random:
            module.random = _RNG  # type: ignore[attr-defined]


def short_error(err: BaseException) -> str:
    """`Type: first line` of an error, at most 200 characters of text."""
    text = str(err).splitlines()[0] if str(err) else ""
    return f"{type(err).__name__}: {text[:200]}" if text else type(err).__name__


def refused_locally(err: BaseException) -> str:
    """The permanent-failure message for a request an SDK refused before sending it."""
    text = " ".join(str(err).split())
    return (
        f"refused before anything was sent ({type(err).__name__}: {text[:300]}); "
        "retrying would not help"
    )


def raised_by(err: BaseException, *modules: str) -> bool:
    """Whether the error was raised by code in one of the `modules` (or a module below one):
    the innermost frame of its traceback, so an error from a library they call is not."""
    tb = err.__traceback__
    if tb is None:
        return False
    while tb.tb_next is not None:
        tb = tb.tb_next
    where = str(tb.tb_frame.f_globals.get("__name__", ""))
    return any(where == m or where.startswith(m + ".") for m in modules)


def error_chain(err: BaseException) -> Iterator[BaseException]:
    """The error, then its causes and contexts, each once."""
    seen: set[int] = set()
    cur: BaseException | None = err
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        yield cur
        cur = cur.__cause__ or cur.__context__
