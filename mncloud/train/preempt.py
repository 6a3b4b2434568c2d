"""Preemption notices: learn that the cloud is about to take this VM, early enough to checkpoint.

Clouds warn before they reclaim a spot VM; each in its own way:

    AWS    ≈ 2 min   IMDSv2: PUT /latest/api/token, then poll GET
                     /latest/meta-data/spot/instance-action every 5 s (404 until a notice)
    GCP    30 s      GET /computeMetadata/v1/instance/preempted (FALSE → TRUE), long-polled with
                     ?wait_for_change=true&last_etag=…; then ACPI shutdown → SIGTERM
    Azure  ≥ 30 s    Scheduled Events: poll GET /metadata/scheduledevents every second for a
                     "Preempt" event (its NotBefore is the deadline)
    others none      (RunPod, Lambda, Kubernetes: a SIGTERM at best)

A `PreemptionWatcher` runs in every training process. On the node's first process (LOCAL_RANK 0)
one daemon thread per metadata protocol watches the service (one thread per node: the cluster
learns from it through the agreement below); every process also takes SIGTERM and SIGUSR1 as a
notice (torchrun forwards SIGTERM to its workers and SIGKILLs them 30 s later). The protocol
comes from `MNCLOUD_METADATA_PROTOCOL`, else from the cloud the task landed on (SkyPilot's
`SKYPILOT_CLUSTER_INFO`, else `MNCLOUD_CLOUD`), else it is probed with short timeouts (in the
thread, never on the training path); `MNCLOUD_METADATA_URL` points it at another service
(tests, the local backend). A second SIGTERM restores the default action and stops the process
at once.

The watcher only raises a flag; `CheckpointManager` turns it into one coordinated save (see
`mncloud/train/ckpt.py` and `emergency.py`). Sequence, 2 nodes × 2 ranks on GCP, step time
0.5 s, interval 100:

    t=0     node 1's metadata says preempted=TRUE; its watcher thread sets the notice
            (deadline t+30). Ranks 2, 3 (node 1) see it at their next maybe_save; ranks 0, 1
            do not know yet.
    t=0.3   step 1234 ends. maybe_save(1234) on all four ranks: the all-reduce of the flag
            (gloo, one int; the same collective that asks "uploads done?") says 1 → every rank
            agrees on step 1234 and on the earliest deadline of any rank.
    t=0.4   all ranks stage step 1234 to CPU memory and write their shards to local disk,
            then upload them with what time is left (until deadline − safety margin).
    t=2     uploads done on every rank → rank 0 writes manifest and COMPLETE; every rank
            writes $MNCLOUD_PREEMPT_MARKER and exits 115 (PREEMPTED_EXIT_CODE); run.sh turns
            torchrun's exit into 115 too, which SkyPilot (recover_on_exit_codes) and the local
            supervisor treat as a preemption.
    t=30    the VM goes. The recovered job loads step 1234: no step lost.

If the deadline comes first (a big model, a 30 s notice), no COMPLETE is written for that step
and the ranks exit 115 anyway; recovery loads the newest periodic checkpoint (never a torn one).
"""

from __future__ import annotations

import contextlib
import http.client
import json
import logging
import os
import signal
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from email.utils import parsedate_to_datetime
from types import FrameType
from typing import Any, ClassVar

from mncloud import constants

log = logging.getLogger(__name__)

GCP_NOTICE_S = 30.0
"""GCP's notice; its metadata carries no deadline."""
DEFAULT_SIGNAL_NOTICE_S = 30.0
"""Time assumed after SIGTERM/SIGUSR1: torchrun SIGKILLs its workers 30 s after forwarding one."""
WATCHED_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)


@dataclass(frozen=True)
class Notice:
    """The cloud (or a signal) said this VM goes away at `deadline`."""

    source: str
    """aws, gcp, azure, SIGTERM, SIGUSR1 or manual."""
    deadline: float
    """Epoch seconds when the VM is expected to disappear."""
    received: float
    """Epoch seconds when the notice was seen."""
    detail: str = ""

    @property
    def remaining(self) -> float:
        """Seconds left until the deadline (negative once it passed)."""
        return self.deadline - time.time()


class Preempted(SystemExit):
    """Raised by `CheckpointManager.maybe_save` on every rank once the emergency checkpoint is
    done (or its time ran out). Uncaught, it exits the process with PREEMPTED_EXIT_CODE."""

    def __init__(self, step: int, committed: int | None, notice: Notice) -> None:
        super().__init__(constants.PREEMPTED_EXIT_CODE)
        self.step = step
        """The step all ranks agreed to save."""
        self.committed = committed
        """The newest step known committed when the ranks stopped (None: none)."""
        self.notice = notice


# --------------------------------------------------------------------------- detectors


class Detector:
    """One cloud's metadata protocol: `check` asks once (may long-poll), `probe` asks if it is
    this cloud at all. Subclasses are registered in DETECTORS by `name`."""

    name: ClassVar[str]
    default_url: ClassVar[str]
    default_poll_s: ClassVar[float]

    def __init__(
        self, base_url: str | None = None, *, poll_s: float | None = None, timeout_s: float = 2.0
    ) -> None:
        self.base_url = (base_url or self.default_url).rstrip("/")
        self.poll_s = self.default_poll_s if poll_s is None else poll_s
        self.timeout_s = timeout_s

    def _request(
        self, path: str, *, method: str = "GET", headers: dict[str, str] | None = None,
        timeout: float | None = None,
    ) -> tuple[int, str, dict[str, str]]:  # fmt: skip
        req = urllib.request.Request(
            self.base_url + path, method=method, headers=headers or {},
            data=b"" if method == "PUT" else None,
        )  # fmt: skip
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # never a proxy
        try:
            with opener.open(req, timeout=timeout or self.timeout_s) as resp:
                return resp.status, resp.read().decode(errors="replace"), dict(resp.headers)
        except urllib.error.HTTPError as err:
            return err.code, err.read().decode(errors="replace"), dict(err.headers or {})

    def check(self) -> Notice | None:
        raise NotImplementedError

    def probe(self, timeout_s: float = 0.5) -> bool:
        raise NotImplementedError


class AwsDetector(Detector):
    """EC2 IMDSv2 spot instance-action; polled every 5 s (AWS's advice), token refreshed."""

    name = "aws"
    default_url = "http://169.254.169.254"
    default_poll_s = 5.0
    TOKEN_TTL_S = 21600

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._token: str | None = None
        self._token_at = 0.0

    def _get_token(self, timeout: float | None = None) -> str | None:
        if self._token is None or time.monotonic() - self._token_at > self.TOKEN_TTL_S / 2:
            code, body, _ = self._request(
                "/latest/api/token", method="PUT", timeout=timeout,
                headers={"X-aws-ec2-metadata-token-ttl-seconds": str(self.TOKEN_TTL_S)},
            )  # fmt: skip
            if code != 200:
                return None
            self._token, self._token_at = body.strip(), time.monotonic()
        return self._token

    def check(self) -> Notice | None:
        token = self._get_token()
        if token is None:
            raise OSError("IMDSv2 token request refused")
        code, body, _ = self._request(
            "/latest/meta-data/spot/instance-action", headers={"X-aws-ec2-metadata-token": token}
        )
        if code == 401:
            self._token = None  # expired: a new one next time
            return None
        if code != 200:
            return None
        now = time.time()
        data = json.loads(body)
        if data.get("action") not in ("terminate", "stop", "hibernate"):
            return None
        deadline = now + 120.0
        with contextlib.suppress(ValueError, TypeError):
            deadline = datetime.fromisoformat(str(data["time"]).replace("Z", "+00:00")).timestamp()
        return Notice("aws", deadline, now, detail=f"spot instance-action {data.get('action')}")

    def probe(self, timeout_s: float = 0.5) -> bool:
        with contextlib.suppress(OSError, ValueError):
            return self._get_token(timeout=timeout_s) is not None
        return False


class GcpDetector(Detector):
    """GCE `instance/preempted`, long-polled (wait_for_change with the last ETag)."""

    name = "gcp"
    default_url = "http://metadata.google.internal"
    default_poll_s = 0.0  # the long-poll is the wait
    LONG_POLL_S = 30
    _PATH = "/computeMetadata/v1/instance/preempted"
    _HEADERS: ClassVar[dict[str, str]] = {"Metadata-Flavor": "Google"}

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._etag: str | None = None

    def check(self) -> Notice | None:
        path, timeout = self._PATH, None
        if self._etag is not None:
            path += f"?wait_for_change=true&last_etag={self._etag}&timeout_sec={self.LONG_POLL_S}"
            timeout = self.LONG_POLL_S + 5.0
        code, body, headers = self._request(path, headers=self._HEADERS, timeout=timeout)
        if code != 200:
            raise OSError(f"GCE metadata answered {code}")
        self._etag = headers.get("ETag") or headers.get("Etag") or self._etag or "NONE"
        if body.strip().upper() != "TRUE":
            return None
        now = time.time()
        return Notice("gcp", now + GCP_NOTICE_S, now, detail="instance/preempted is TRUE")

    def probe(self, timeout_s: float = 0.5) -> bool:
        with contextlib.suppress(OSError, ValueError):
            code, _, headers = self._request(
                "/computeMetadata/v1/", headers=self._HEADERS, timeout=timeout_s
            )
            return code == 200 and headers.get("Metadata-Flavor") == "Google"
        return False


class AzureDetector(Detector):
    """Azure Scheduled Events; a `Preempt` event for this VM (or any, if its name is unknown)."""

    name = "azure"
    default_url = "http://169.254.169.254"
    default_poll_s = 1.0
    _HEADERS: ClassVar[dict[str, str]] = {"Metadata": "true"}

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._vm_name: str | None = None

    def _name(self, timeout: float | None = None) -> str | None:
        if self._vm_name is None:
            code, body, _ = self._request(
                "/metadata/instance/compute/name?api-version=2021-02-01&format=text",
                headers=self._HEADERS, timeout=timeout,
            )  # fmt: skip
            if code == 200 and body.strip():
                self._vm_name = body.strip()
        return self._vm_name

    def check(self) -> Notice | None:
        name = self._name()
        code, body, _ = self._request(
            "/metadata/scheduledevents?api-version=2020-07-01", headers=self._HEADERS
        )
        if code != 200:
            raise OSError(f"Azure scheduled events answered {code}")
        now = time.time()
        for event in json.loads(body).get("Events") or []:
            resources = event.get("Resources") or []
            if event.get("EventType") != "Preempt" or (
                name and resources and name not in resources
            ):
                continue
            deadline = now + 30.0
            with contextlib.suppress(TypeError, ValueError):
                deadline = parsedate_to_datetime(event["NotBefore"]).timestamp()
            return Notice("azure", deadline, now, detail=f"scheduled event {event.get('EventId')}")
        return None

    def probe(self, timeout_s: float = 0.5) -> bool:
        with contextlib.suppress(OSError, ValueError):
            return self._name(timeout=timeout_s) is not None
        return False


DETECTORS: dict[str, type[Detector]] = {
    d.name: d for d in (AwsDetector, GcpDetector, AzureDetector)
}
"""Metadata protocols by name; also the order in which an unknown cloud is probed is gcp, aws,
azure (GCP answers on its own host name, so it is told apart from the two on 169.254.169.254)."""
_PROBE_ORDER = ("gcp", "aws", "azure")


def protocols_from_env(env: dict[str, str] | None = None) -> list[str] | None:
    """The metadata protocols to watch: a list (maybe empty), or None to probe."""
    env = dict(os.environ) if env is None else env
    chosen = env.get(constants.METADATA_PROTOCOL_ENV, "").strip().lower()
    if chosen:
        if chosen == "none":
            return []
        if chosen == "all":
            return list(DETECTORS)
        names = [c.strip() for c in chosen.split(",") if c.strip()]
        unknown = [n for n in names if n not in DETECTORS]
        if unknown:
            raise ValueError(
                f"{constants.METADATA_PROTOCOL_ENV}={chosen}: unknown {unknown[0]!r}; use "
                f"{', '.join(DETECTORS)}, all or none"
            )
        return names
    cloud = ""
    with contextlib.suppress(ValueError, AttributeError):  # where SkyPilot put the task
        cloud = str(json.loads(env.get(constants.SKYPILOT_CLUSTER_INFO) or "{}").get("cloud") or "")
    cloud = (cloud or env.get(constants.CLOUD_ENV, "")).strip().lower()
    if cloud:
        return [cloud] if cloud in DETECTORS else []  # RunPod & co. send no notice
    return None


# --------------------------------------------------------------------------- watcher


@dataclass(frozen=True)
class _Source:
    """A notice source polled beside the cloud's metadata service (e.g. a stop request)."""

    name: str
    check: Callable[[], Notice | None]
    poll_s: float


class PreemptionWatcher:
    """Watches for a notice in daemon threads and through signals; `notice` is set once.

    `protocols`: metadata protocols to watch (None: probe for one). `poll` False watches signals
    only (every process but the node's first). `signals` are taken as a notice that leaves
    `signal_notice_s` seconds.
    """

    def __init__(
        self,
        protocols: list[str] | None = None,
        *,
        base_url: str | None = None,
        poll: bool = True,
        poll_s: float | None = None,
        signals: tuple[signal.Signals, ...] = WATCHED_SIGNALS,
        signal_notice_s: float = DEFAULT_SIGNAL_NOTICE_S,
    ) -> None:
        self.protocols = protocols
        self.base_url = base_url
        self.poll = poll
        self.poll_s = poll_s
        self.signals = signals
        self.signal_notice_s = signal_notice_s
        self._notice: Notice | None = None
        self._event = threading.Event()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._previous: dict[signal.Signals, Any] = {}

    @classmethod
    def from_env(cls, *, poll: bool | None = None) -> PreemptionWatcher:
        """Configured by the `MNCLOUD_METADATA_*`, `SKYPILOT_CLUSTER_INFO` and `MNCLOUD_CLOUD`
        variables; polls on the
        node's first process (LOCAL_RANK 0) unless `poll` says otherwise."""
        env = os.environ
        if poll is None:
            poll = env.get("LOCAL_RANK", "0") == "0"
        poll_s = env.get(constants.METADATA_POLL_ENV)
        grace = env.get(constants.SIGNAL_NOTICE_ENV)
        return cls(
            protocols_from_env(),
            base_url=env.get(constants.METADATA_URL_ENV) or None,
            poll=poll,
            poll_s=float(poll_s) if poll_s else None,
            signal_notice_s=float(grace) if grace else DEFAULT_SIGNAL_NOTICE_S,
        )

    @property
    def notice(self) -> Notice | None:
        """The first notice seen, or None."""
        return self._notice

    def wait(self, timeout: float | None = None) -> Notice | None:
        """Block until a notice arrives (or `timeout`); return it."""
        self._event.wait(timeout)
        return self._notice

    def notify(self, notice: Notice) -> None:
        """Record a notice (the first one wins)."""
        with self._lock:
            if self._notice is not None:
                return
            self._notice = notice
        self._event.set()
        log.warning("preemption notice from %s (%s): %.0fs left", notice.source,
                    notice.detail or "no detail", notice.remaining)  # fmt: skip

    def start(self) -> PreemptionWatcher:
        """Install the signal handlers (main thread only) and start the watch threads."""
        if threading.current_thread() is threading.main_thread():
            for sig in self.signals:
                self._previous[sig] = signal.signal(sig, self._on_signal)
        else:
            log.warning("preemption watcher started outside the main thread: signals not watched")
        if self.poll and self.protocols != []:
            names = self.protocols if self.protocols is not None else [None]
            for name in names:
                thread = threading.Thread(
                    target=self._watch, args=(name,), daemon=True,
                    name=f"mncloud-preempt-{name or 'probe'}",
                )  # fmt: skip
                thread.start()
                self._threads.append(thread)
        return self

    def watch_source(self, name: str, check: Callable[[], Notice | None], poll_s: float) -> None:
        """Also poll `check` (a notice or None) every `poll_s` seconds in a daemon thread, on
        the node's first process only (`poll`); a failing check is tried again."""
        if not self.poll:
            return
        source = _Source(name, check, poll_s)
        thread = threading.Thread(
            target=self._watch_source, args=(source,), daemon=True, name=f"mncloud-{name}"
        )
        thread.start()
        self._threads.append(thread)

    def _watch_source(self, source: _Source) -> None:
        failures = 0
        while not self._stop.is_set() and self._notice is None:
            try:
                notice = source.check()
                failures = 0
            except Exception as err:  # any failure of a check: try again at the next poll
                failures += 1
                if failures == 3:
                    log.warning("preemption watcher (%s): %s; still trying", source.name, err)
                notice = None
            if notice is not None:
                self.notify(notice)
                return
            self._stop.wait(source.poll_s)

    def stop(self) -> None:
        """Restore the signal handlers; the threads end at their next poll."""
        self._stop.set()
        if threading.current_thread() is threading.main_thread():
            for sig, previous in self._previous.items():
                with contextlib.suppress(ValueError, TypeError):
                    signal.signal(sig, previous)
        self._previous.clear()

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        sig = signal.Signals(signum)
        if self._notice is not None and self._notice.source == sig.name:
            # Asked twice: stop now, the way the signal would have without us.
            previous = self._previous.get(sig, signal.SIG_DFL)
            signal.signal(sig, previous if callable(previous) else signal.SIG_DFL)
            os.kill(os.getpid(), signum)
            return
        now = time.time()
        self.notify(Notice(sig.name, now + self.signal_notice_s, now, detail="signal"))

    def _detector(self, name: str | None) -> Detector | None:
        if name is not None:
            return DETECTORS[name](self.base_url, poll_s=self.poll_s)
        for candidate in _PROBE_ORDER:
            det = DETECTORS[candidate](self.base_url, poll_s=self.poll_s)
            if self._stop.is_set():
                return None
            if det.probe():
                log.info("preemption watcher: %s metadata service found", candidate)
                return det
        log.info("preemption watcher: no cloud metadata service answers; signals only")
        return None

    def _watch(self, name: str | None) -> None:
        det = self._detector(name)
        if det is None:
            return
        failures = 0
        while not self._stop.is_set() and self._notice is None:
            try:
                notice = det.check()
                failures = 0
            except (OSError, ValueError, http.client.HTTPException) as err:
                failures += 1
                if failures == 3:
                    log.warning("preemption watcher (%s): %s at %s; still trying", det.name, err,
                                det.base_url)  # fmt: skip
                self._stop.wait(max(det.poll_s, 1.0))
                continue
            if notice is not None:
                self.notify(notice)
                return
            self._stop.wait(det.poll_s)
