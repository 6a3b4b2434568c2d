"""The single checks of a preflight (laptop and node): code hash, GPUs, paths, bucket,
interfaces, launcher, credentials. Each returns a `Check`; see `mncloud.doctor` for the design."""

from __future__ import annotations

import contextlib
import hashlib
import os
import secrets
import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

#: Exit code of a failed node preflight (sysexits EX_CONFIG): not torchrun's 1, not a signal.
PREFLIGHT_FAILED_EXIT_CODE = 78
#: How a check's detail begins when the storage did not answer: a storage outage, not a fault
#: of the setup. Every node gets the gang's verdict as lines, and a verdict of such lines
#: alone (`outage_only`) exits `constants.STORAGE_OUTAGE_EXIT_CODE` on every node.
OUTAGE_WORDS = "storage outage:"
GREETING = b"MNCLOUD-PREFLIGHT 1\n"
DEFAULT_TIMEOUT = 60.0
CREDENTIAL_TIMEOUT = 20.0
#: Files whose content makes up "the code" of a workdir.
CODE_SUFFIXES = frozenset(
    {".py", ".pyx", ".pxd", ".c", ".cc", ".cpp", ".cu", ".h", ".hpp", ".sh", ".toml", ".cfg",
     ".ini", ".yaml", ".yml", ".j2", ".lock"}
)  # fmt: skip
CODE_NAMES = frozenset({"Dockerfile", "Makefile", "requirements.txt"})
SKIP_DIRS = frozenset(
    {".git", "__pycache__", ".venv", "venv", "node_modules", ".mypy_cache", ".pytest_cache",
     ".ruff_cache", ".tox", ".eggs"}
)  # fmt: skip


@dataclass(frozen=True)
class Check:
    """The outcome of one check: `detail` is one line a user can act on."""

    name: str
    ok: bool
    detail: str
    node: int | None = None

    def line(self) -> str:
        """`preflight failed on node R: …` (node checks) or `name: detail`."""
        if self.node is not None and not self.ok:
            return f"preflight failed on node {self.node}: {self.detail}"
        return f"{self.name}: {self.detail}"


def failures(checks: Iterable[Check]) -> list[Check]:
    return [c for c in checks if not c.ok]


def outage_only(problems: Iterable[str]) -> bool:
    """Whether every failure line says the storage did not answer (and there is one)."""
    lines = list(problems)
    return bool(lines) and all(OUTAGE_WORDS in line for line in lines)


def storage_failure(what: str, err: BaseException) -> str:
    """A bucket check's failure detail: an outage (`OUTAGE_WORDS`) when the storage did not
    answer within the retry budget, else `what` (e.g. "… is not writable") with the cause."""
    from mncloud.storage.retry import StorageUnreachable

    if isinstance(err, StorageUnreachable):
        return f"{OUTAGE_WORDS} {_one_line(err)}"
    return f"{what}: {_one_line(err)}"


# --------------------------------------------------------------------------- single checks


def code_hash(workdir: str | os.PathLike[str]) -> str:
    """sha256 over the relative paths and contents of the workdir's source-like files."""
    root = Path(workdir)
    h = hashlib.sha256()
    for dirpath, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d not in SKIP_DIRS and not d.endswith(".egg-info"))
        for name in sorted(files):
            path = Path(dirpath) / name
            if path.suffix not in CODE_SUFFIXES and name not in CODE_NAMES:
                continue
            if path.is_symlink() or not path.is_file():
                continue
            h.update(path.relative_to(root).as_posix().encode() + b"\0")
            with contextlib.suppress(OSError):
                h.update(hashlib.sha256(path.read_bytes()).digest())
    return h.hexdigest()[:16]


def check_code_hash(found: str, expected: str | None, node: int | None = None) -> Check:
    """Whether a workdir's code hash (`code_hash`) is the one expected."""
    if expected and found != expected[: len(found)]:
        return Check(
            "code", False, f"workdir code hash {found} ≠ expected {expected} (stale sync?)", node
        )
    return Check("code", True, f"workdir code hash {found}", node)


def count_gpus() -> tuple[int | None, str]:
    """Visible NVIDIA GPUs by `nvidia-smi -L` (else torch, if installed); (None, why) if unknown."""
    smi = shutil.which("nvidia-smi")
    if smi:
        try:
            proc = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=20)
        except subprocess.TimeoutExpired:
            return None, "nvidia-smi -L timed out (driver hung?)"
        if proc.returncode != 0:
            why = (proc.stderr or proc.stdout).strip().splitlines()
            return None, f"nvidia-smi failed: {why[0] if why else proc.returncode}"
        visible = [ln for ln in proc.stdout.splitlines() if ln.startswith("GPU ")]
        mask = os.environ.get("CUDA_VISIBLE_DEVICES")
        if mask is not None:
            return min(len(visible), len([d for d in mask.split(",") if d.strip()])), "nvidia-smi"
        return len(visible), "nvidia-smi"
    import importlib.util

    if importlib.util.find_spec("torch") is not None:
        import torch

        return int(torch.cuda.device_count()), "torch"
    return None, "no nvidia-smi and no torch: cannot see GPUs (is the NVIDIA driver installed?)"


def check_gpus(expected: int, node: int | None = None) -> Check:
    """GPUs visible == requested per node; `expected` 0 means a CPU task (skipped)."""
    if expected <= 0:
        return Check("gpus", True, "CPU task: no GPUs expected", node)
    found, how = count_gpus()
    if found is None:
        return Check("gpus", False, how, node)
    if found != expected:
        return Check("gpus", False, f"{found} GPU(s) visible ({how}), {expected} requested", node)
    return Check("gpus", True, f"{found} GPU(s) visible", node)


def _is_bucket_path(path: str) -> bool:
    return path.startswith(("s3://", "gs://"))


def check_path(path: str, node: int | None = None, retry_seconds: float = 5.0) -> Check:
    """A data path exists: a local file or folder, or an object or prefix in a bucket."""
    if _is_bucket_path(path) or path.startswith("file://"):
        from mncloud.storage import open_bucket

        try:
            bucket, prefix = open_bucket(path, retry_seconds=retry_seconds)
            found = bucket.exists(prefix) if prefix else False
            found = found or bool(bucket.list(prefix.rstrip("/") + "/" if prefix else ""))
        except Exception as err:
            return Check("path", False, storage_failure(path, err), node)
        if not found:
            return Check(
                "path", False, f"required path {path} does not exist (nothing there)", node
            )
        return Check("path", True, f"{path} exists", node)
    if not Path(path).expanduser().exists():
        return Check("path", False, f"required path {path} does not exist", node)
    return Check("path", True, f"{path} exists", node)


def check_bucket(uri: str, node: int | None = None, retry_seconds: float = 5.0) -> Check:
    """The bucket is reachable and writable: write, read back and delete a probe object."""
    from mncloud.storage import join_key, open_bucket

    tag = f"node-{node}" if node is not None else socket.gethostname()
    try:
        bucket, prefix = open_bucket(uri, retry_seconds=retry_seconds)
        key = join_key(prefix, ".mncloud-preflight", f"{tag}-{secrets.token_hex(4)}")
        payload = secrets.token_bytes(16)
        bucket.put_bytes(key, payload)
        try:
            if bucket.get_bytes(key) != payload:
                return Check("bucket", False, f"{uri}: read back different bytes", node)
        finally:
            bucket.delete(key)
    except Exception as err:
        return Check("bucket", False, storage_failure(f"{uri} is not writable", err), node)
    return Check("bucket", True, f"{uri} is reachable and writable", node)


def interfaces() -> list[str]:
    """Network interface names of this host."""
    with contextlib.suppress(OSError):
        return sorted(name for _i, name in socket.if_nameindex())
    net = Path("/sys/class/net")
    return sorted(p.name for p in net.iterdir()) if net.is_dir() else []


def check_ifname(
    value: str | None, node: int | None = None, var: str = "NCCL_SOCKET_IFNAME"
) -> Check:
    """`NCCL_SOCKET_IFNAME` (NCCL syntax: `eth`, `=eth0`, `eth0,ens5`, `^docker`) matches."""
    if not value:
        return Check("ifname", True, f"{var} not set: NCCL picks an interface", node)
    if value.startswith("^"):
        return Check("ifname", True, f"{var}={value} excludes interfaces", node)
    have = interfaces()
    exact = value.startswith("=")
    wanted = [w.strip() for w in value.lstrip("=").split(",") if w.strip()]
    for w in wanted:
        if any(name == w if exact else name.startswith(w) for name in have):
            return Check("ifname", True, f"{var}={value} matches an interface", node)
    return Check(
        "ifname",
        False,
        f"{var}={value} matches no network interface (this node has: {', '.join(have)})",
        node,
    )


def check_launcher(name: str | None, node: int | None = None) -> Check:
    """The `--launcher` program is on PATH (torchrun, accelerate, deepspeed)."""
    if not name or name == "none":
        return Check("launcher", True, "no launcher: the script runs itself", node)
    if shutil.which(name) is None:
        package = {"torchrun": "torch"}.get(name, name)
        return Check(
            "launcher",
            False,
            f"launcher {name!r} is not installed on this node: pip install {package} "
            "(in --setup or --requirements), or pick another --launcher",
            node,
        )
    return Check("launcher", True, f"launcher {name} found", node)


def check_resolvable(host: str, node: int | None = None) -> Check:
    """The master address resolves to an IP."""
    try:
        socket.getaddrinfo(host, None)
    except OSError as err:
        return Check("master", False, f"master address {host!r} does not resolve ({err})", node)
    return Check("master", True, f"master address {host} resolves", node)


def _one_line(err: BaseException) -> str:
    text = " ".join(str(err).split()) or type(err).__name__
    return text[:300]


# --------------------------------------------------------------------------- credentials


def _advice(reason: str) -> str:
    """SkyPilot's multi-line reason as one line: its first sentence and `$ command`, if any."""
    lines = [ln.strip() for ln in reason.splitlines() if ln.strip()]
    commands = [ln[1:].strip() for ln in lines if ln.startswith("$")]
    if commands:
        first = lines[0].split(" Run the following")[0].split(". ")[0].rstrip(".:")
        return f"{first} — run `{commands[0]}` (then `sky check`)"
    text = " ".join(lines) or "not usable"
    return (text if len(text) <= 240 else text[:237] + "...") + " (then `sky check`)"


def check_credentials(
    clouds: list[str],
    timeout: float = CREDENTIAL_TIMEOUT,
    probe: Callable[[str], tuple[bool, str | None]] | None = None,
) -> list[Check]:
    """Credentials of each cloud by SkyPilot's own `check_credentials`, with a deadline.

    Each runs in a daemon thread; one that calls a cloud API and hangs (offline) is reported
    as timed out after `timeout` seconds and does not keep the process alive.
    """
    clouds = [c for c in dict.fromkeys(c.lower() for c in clouds) if c != "local"]
    probe = probe or _sky_credentials
    results: dict[str, tuple[bool, str | None]] = {}

    def run(cloud: str) -> None:
        try:
            results[cloud] = probe(cloud)
        except Exception as err:
            results[cloud] = (False, _one_line(err))

    threads = {c: threading.Thread(target=run, args=(c,), daemon=True) for c in clouds}
    for t in threads.values():
        t.start()
    deadline = time.monotonic() + timeout
    checks = []
    for cloud, thread in threads.items():
        thread.join(max(0.0, deadline - time.monotonic()))
        if cloud not in results:
            detail = (
                f"{cloud}: credential check timed out after {timeout:.0f}s (offline?) — "
                "run `sky check` when online"
            )
            checks.append(Check(f"credentials {cloud}", False, detail))
            continue
        ok, reason = results[cloud]
        detail = f"{cloud}: credentials ok" if ok else f"{cloud}: {_advice(reason or '')}"
        checks.append(Check(f"credentials {cloud}", ok, detail))
    return checks


def _sky_credentials(cloud: str) -> tuple[bool, str | None]:
    from sky.clouds import cloud as cloud_lib
    from sky.utils import registry

    obj = registry.CLOUD_REGISTRY.from_str(cloud)
    if obj is None:
        return False, f"unknown cloud {cloud!r}"
    ok, reason = obj.check_credentials(cloud_lib.CloudCapability.COMPUTE)
    if isinstance(reason, dict):  # some clouds answer per context
        reason = "; ".join(f"{k}: {v}" for k, v in reason.items())
    return bool(ok), reason
