"""A cloud metadata service on 127.0.0.1 that announces spot preemptions, for local runs and tests.

It speaks the part of each cloud's instance metadata protocol that `mncloud.train.preempt`
watches, per simulated node (`http://127.0.0.1:PORT/node/N` is node N's metadata root), and
answers "no notice" until `announce` flips a node:

    AWS    PUT  /latest/api/token  (X-aws-ec2-metadata-token-ttl-seconds) → token
           GET  /latest/meta-data/spot/instance-action (X-aws-ec2-metadata-token)
                404 → 200 {"action": "terminate", "time": "2025-01-01T12:00:30Z"}
    GCP    GET  /computeMetadata/v1/instance/preempted (Metadata-Flavor: Google)
                FALSE → TRUE; ETag, ?wait_for_change=true&last_etag=…&timeout_sec=… long-poll
    Azure  GET  /metadata/scheduledevents?api-version=2020-07-01 (Metadata: true)
                {"DocumentIncarnation": n, "Events": [{"EventType": "Preempt", "NotBefore": …}]}
           GET  /metadata/instance/compute/name?format=text → node-N

Requests without the protocol's header are refused as the clouds refuse them (AWS 401, GCP 403,
Azure 400). The local backend's supervisor runs one per run (`mncloud chaos preempt --notice`
flips it); tests start their own. Torch-free; standard library only.
"""

from __future__ import annotations

import hashlib
import json
import re
import secrets
import sys
import threading
from collections import Counter
from datetime import datetime, timezone
from email.utils import format_datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

PROTOCOLS = ("aws", "gcp", "azure")
_NODE = re.compile(r"^/node/(\d+)(/.*)?$")
_GCP_PREEMPTED = "/computeMetadata/v1/instance/preempted"
_MAX_LONG_POLL_S = 60.0


class _QuietServer(ThreadingHTTPServer):
    """A client that went away mid-request (a node killed while it polled) is not an error:
    no traceback in supervisor.log; anything else is reported as the standard library does."""

    def handle_error(self, request: Any, client_address: Any) -> None:
        if isinstance(sys.exc_info()[1], ConnectionError):  # BrokenPipe, ConnectionReset
            return
        super().handle_error(request, client_address)


class MetadataServer:
    """Per-node metadata for AWS, GCP and Azure on 127.0.0.1; `announce` sends a notice."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        self._cond = threading.Condition()
        self._notices: dict[int, dict[str, float]] = {}  # node → protocol → deadline
        self._incarnation = 1
        self._tokens: set[str] = set()
        self._stopped = False
        self.requests: Counter[tuple[int, str]] = Counter()
        """Answered requests per (node, protocol), so tests can await polls."""
        self._asked: set[int] = set()
        """Nodes that asked for their metadata since the last `clear` (they watch notices)."""
        self._httpd = _QuietServer((host, port), _handler(self))
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, name="mncloud-metadata", daemon=True
        )

    @property
    def port(self) -> int:
        return int(self._httpd.server_address[1])

    def url(self, node: int = 0) -> str:
        """Node `node`'s metadata root (what `MNCLOUD_METADATA_URL` is set to)."""
        return f"http://127.0.0.1:{self.port}/node/{node}"

    def start(self) -> MetadataServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        with self._cond:
            self._stopped = True
            self._cond.notify_all()
        self._httpd.shutdown()
        self._httpd.server_close()

    def __enter__(self) -> MetadataServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def announce(self, node: int, protocol: str, deadline: float) -> None:
        """From now on node `node` reports a preemption at `deadline` (epoch seconds) in
        `protocol` (aws, gcp, azure or all)."""
        chosen = PROTOCOLS if protocol == "all" else (protocol,)
        if not set(chosen) <= set(PROTOCOLS):
            raise ValueError(f"unknown metadata protocol {protocol!r}; use {', '.join(PROTOCOLS)}")
        with self._cond:
            for p in chosen:
                self._notices.setdefault(node, {})[p] = deadline
            self._incarnation += 1
            self._cond.notify_all()

    def watching(self) -> set[int]:
        """The nodes that asked for their metadata since the last `clear`: they would see a
        notice (a script without a CheckpointManager, or with its watch off, never asks)."""
        with self._cond:
            return set(self._asked)

    def clear(self) -> None:
        """No node has a notice (a relaunched cluster is a fresh set of VMs)."""
        with self._cond:
            self._notices.clear()
            self._asked.clear()
            self._incarnation += 1
            self._cond.notify_all()

    def wait_requests(self, node: int, protocol: str, count: int, timeout: float = 30) -> bool:
        """Wait until `count` requests of `protocol` from `node` were answered."""
        with self._cond:
            return self._cond.wait_for(lambda: self.requests[node, protocol] >= count, timeout)

    # ------------------------------------------------------------------ answers
    def _deadline(self, node: int, protocol: str) -> float | None:
        return self._notices.get(node, {}).get(protocol)

    def _answer(self, h: BaseHTTPRequestHandler, method: str) -> tuple[int, str, dict[str, str]]:
        url = urlsplit(h.path)
        match = _NODE.match(url.path)
        node, path = (int(match[1]), match[2] or "/") if match else (0, url.path)
        query = {k: v[-1] for k, v in parse_qs(url.query).items()}
        if path.startswith("/latest/"):
            protocol, answer = "aws", self._aws(h, method, node, path)
        elif path.startswith("/computeMetadata/"):
            protocol, answer = "gcp", self._gcp(h, node, path, query)
        elif path.startswith("/metadata/"):
            protocol, answer = "azure", self._azure(h, node, path)
        else:
            protocol, answer = "", (404, "not found\n", {})
        with self._cond:
            self.requests[node, protocol] += 1
            if protocol:
                self._asked.add(node)
            self._cond.notify_all()
        return answer

    def _aws(self, h: BaseHTTPRequestHandler, method: str, node: int, path: str) -> Any:
        if method == "PUT" and path == "/latest/api/token":
            if not h.headers.get("X-aws-ec2-metadata-token-ttl-seconds"):
                return 400, "missing X-aws-ec2-metadata-token-ttl-seconds\n", {}
            token = secrets.token_urlsafe(24)
            with self._cond:
                self._tokens.add(token)
            return 200, token, {}
        if h.headers.get("X-aws-ec2-metadata-token") not in self._tokens:
            return 401, "", {}
        if path in ("/latest/meta-data/", "/latest/meta-data/instance-id"):
            return 200, f"i-local{node:010d}", {}
        if path != "/latest/meta-data/spot/instance-action":
            return 404, "", {}
        deadline = self._deadline(node, "aws")
        if deadline is None:
            return 404, "", {}
        when = datetime.fromtimestamp(deadline, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        return 200, json.dumps({"action": "terminate", "time": when}), {}

    def _gcp(self, h: BaseHTTPRequestHandler, node: int, path: str, q: dict[str, str]) -> Any:
        if h.headers.get("Metadata-Flavor") != "Google":
            return 403, "Missing Metadata-Flavor:Google header.\n", {}
        headers = {"Metadata-Flavor": "Google"}
        if path != _GCP_PREEMPTED:
            return (200, "", headers) if path.rstrip("/") == "/computeMetadata/v1" else (
                404, "", headers)  # fmt: skip

        def value() -> str:
            return "TRUE" if self._deadline(node, "gcp") is not None else "FALSE"

        def etag(v: str) -> str:
            return hashlib.md5(v.encode()).hexdigest()[:16]

        if q.get("wait_for_change") == "true":  # returns once the value differs from last_etag
            timeout = min(float(q.get("timeout_sec", _MAX_LONG_POLL_S)), _MAX_LONG_POLL_S)
            last = q.get("last_etag") or etag(value())
            with self._cond:
                self._cond.wait_for(lambda: etag(value()) != last or self._stopped, timeout)
        v = value()
        return 200, v, {**headers, "ETag": etag(v)}

    def _azure(self, h: BaseHTTPRequestHandler, node: int, path: str) -> Any:
        if h.headers.get("Metadata") != "true":
            return 400, '{"error": "Bad request. Required metadata header not specified"}', {}
        if path == "/metadata/instance/compute/name":
            return 200, f"node-{node}", {}
        if path != "/metadata/scheduledevents":
            return 404, "", {}
        deadline = self._deadline(node, "azure")
        events = []
        if deadline is not None:
            not_before = datetime.fromtimestamp(deadline, timezone.utc)
            events.append({
                "EventId": f"602d9444-d2cd-49c7-8624-8643e7171297-{node}",
                "EventType": "Preempt",
                "ResourceType": "VirtualMachine",
                "Resources": [f"node-{node}"],
                "EventStatus": "Scheduled",
                "NotBefore": format_datetime(not_before, usegmt=True),
                "Description": "The VM is being preempted (mncloud local simulation).",
                "EventSource": "Platform",
                "DurationInSeconds": -1,
            })  # fmt: skip
        body = {"DocumentIncarnation": self._incarnation, "Events": events}
        return 200, json.dumps(body), {"Content-Type": "application/json"}


def _handler(server: MetadataServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _reply(self, method: str) -> None:
            if method == "PUT":
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
            code, body, headers = server._answer(self, method)
            data = body.encode()
            self.send_response(code)
            for k, v in headers.items():
                self.send_header(k, v)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            self._reply("GET")

        def do_PUT(self) -> None:
            self._reply("PUT")

        def log_message(self, format: str, *args: Any) -> None:  # quiet
            return

    return Handler
