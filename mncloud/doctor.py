"""Preflight checks: name a broken setup in seconds instead of hanging a 32-GPU rendezvous.

Two places run them. `mncloud doctor` on the laptop: cloud credentials (SkyPilot's own checks,
with a deadline, since they may call the cloud), the bucket reachable and writable (a probe
object is written, read back and deleted), data paths in buckets. And every node, just before
torchrun (`python -m mncloud.doctor node …` in the rendered `run`): the GPUs visible equal the
request, the `--require-path` data paths exist, `NCCL_SOCKET_IFNAME` names a real interface,
the master address resolves, the bucket works from this node, and — across nodes — the master
is reachable on the rendezvous port, every node runs the same code (a hash of the workdir's
source files) and the node ranks and node count agree.

The gang check (design)
-----------------------
Before torchrun starts nothing listens on MASTER_PORT, so a plain "connect to the master" from
the other nodes would race torchrun's store. Instead the head node's preflight itself listens on
that very port, for at most `--timeout` seconds, and is the meeting point:

    node 0: bind :29500 (fails at once if the port is taken) → accept…
    node 1: connect 10.0.0.1:29500 (retrying until the deadline) ← greeting "MNCLOUD-PREFLIGHT 1"
    node 1: → hello {rank, nodes, host, code_hash, gpus, failures}
    node 0: all N-1 hellos in (or the deadline) → close the listening port → one verdict:
            every failure of any node, or OK → to every node; each node closes first, so the
            TIME_WAITs sit on its side and torchrun on node 0 can bind 29500 again at once
    all:    OK → torchrun; FAIL → print "preflight failed on node R: <cause>", exit 78

This proves exactly the path torchrun needs (node → master:port), needs no bucket, and stops
every node with the same one line. A node that cannot connect by the deadline fails itself
("cannot reach the master …"); the head names every node that never checked in. A node that
connects and gets no greeting has found a running job's store there (a single relaunched node
rejoining): it passes without the gang part. Nodes start `run` together (SkyPilot gang-
schedules it after setup everywhere), so the default 60 s deadline is generous.

The code hash covers source-like files only (`*.py`, configs, shell, requirements — see
`CODE_SUFFIXES`), not data, logs or checkpoints a previous attempt left in the workdir.

No torch or SkyPilot at import; the node entry point uses argparse, not the CLI.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from pathlib import Path

from mncloud import constants

#: Exit code of a failed node preflight (sysexits EX_CONFIG): not torchrun's 1, not a signal.
PREFLIGHT_FAILED_EXIT_CODE = 78
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
            return Check("path", False, f"{path}: {_one_line(err)}", node)
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
        return Check("bucket", False, f"{uri} is not writable: {_one_line(err)}", node)
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


# --------------------------------------------------------------------------- the gang check


@dataclass
class NodeInfo:
    """What a node tells the head in its hello."""

    rank: int
    nodes: int
    host: str
    code_hash: str
    gpus: int | None
    failures: list[str]
    """This node's own failed checks, one line each (without the node prefix)."""


def _readline(sock: socket.socket, deadline: float, limit: int = 1 << 20) -> bytes:
    data = b""
    while not data.endswith(b"\n"):
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError("timed out")
        sock.settimeout(remaining)
        chunk = sock.recv(4096)
        if not chunk:
            break
        data += chunk
        if len(data) > limit:
            raise ValueError("message too long")
    return data


def judge(own: NodeInfo, hellos: dict[int, NodeInfo], extra: list[str]) -> list[str]:
    """Every failure across the gang, one line each; node 0's view is the reference."""
    out = [f"preflight failed on node {own.rank}: {f}" for f in own.failures]
    for rank in sorted(hellos):
        info = hellos[rank]
        out += [f"preflight failed on node {rank}: {f}" for f in info.failures]
        if info.nodes != own.nodes:
            out.append(
                f"preflight failed on node {rank}: it expects {info.nodes} nodes, node 0 "
                f"expects {own.nodes} (SKYPILOT_NUM_NODES differs)"
            )
        if info.code_hash != own.code_hash:
            out.append(
                f"preflight failed on node {rank}: different code (workdir hash "
                f"{info.code_hash}, node 0 has {own.code_hash})"
            )
    return out + extra


def run_head(own: NodeInfo, port: int, timeout: float) -> list[str]:
    """Node 0: listen on the rendezvous port, collect every hello, send one verdict."""
    try:
        server = socket.create_server(("", port), backlog=max(16, own.nodes))
    except OSError as err:
        return [
            f"preflight failed on node 0: cannot listen on rendezvous port {port} "
            f"({err.strerror}); another process holds it — pick a free --master-port"
        ]
    deadline = time.monotonic() + timeout
    hellos: dict[int, NodeInfo] = {}
    conns: list[socket.socket] = []
    extra: list[str] = []
    with server:
        server.settimeout(0.2)
        while len(hellos) < own.nodes - 1 and time.monotonic() < deadline:
            try:
                conn, _addr = server.accept()
            except TimeoutError:
                continue
            conns.append(conn)
            try:
                conn.sendall(GREETING)
                line = _readline(conn, min(deadline, time.monotonic() + 10))
                info = NodeInfo(**json.loads(line))
            except (OSError, ValueError, TypeError) as err:
                extra.append(f"preflight failed on node ?: bad hello from a node ({err})")
                continue
            if info.rank in hellos or not 0 < info.rank < own.nodes:
                extra.append(
                    f"preflight failed on node {info.rank}: rank {info.rank} is claimed twice "
                    f"or out of range for {own.nodes} nodes (host {info.host}; check "
                    "SKYPILOT_NODE_RANK)"
                )
                continue
            hellos[info.rank] = info
    # The port is free again before any node hears the verdict and starts torchrun.
    for rank in (r for r in range(1, own.nodes) if r not in hellos):
        extra.append(
            f"preflight failed on node {rank}: did not reach the master on port {port} "
            f"within {timeout:.0f}s (firewall/security group, wrong MASTER_ADDR, or the node "
            "never started)"
        )
    problems = judge(own, hellos, extra)
    verdict = json.dumps({"ok": not problems, "problems": problems}).encode() + b"\n"
    for conn in conns:
        with contextlib.suppress(OSError):
            conn.sendall(verdict)
    end = time.monotonic() + 5
    for conn in conns:  # let each node close first, so TIME_WAIT sits on its side
        with contextlib.suppress(OSError):
            conn.settimeout(max(0.01, end - time.monotonic()))
            while conn.recv(4096):
                pass
        conn.close()
    return problems


def run_member(own: NodeInfo, master: str, port: int, timeout: float) -> tuple[list[str], str]:
    """A non-head node: reach the head's preflight, send the hello, return its verdict."""
    deadline = time.monotonic() + timeout
    last: BaseException | None = None
    while time.monotonic() < deadline:
        try:
            sock = socket.create_connection((master, port), timeout=2)
        except OSError as err:
            last = err
            time.sleep(0.3)
            continue
        with sock:
            now = time.monotonic()
            try:
                greeting = _readline(sock, min(now + 10, max(deadline, now + 2)), limit=64)
            except (OSError, ValueError):
                greeting = b""
            if greeting != GREETING:
                return [], "the master port answers, but not a preflight (a running job): joining"
            try:
                sock.sendall(json.dumps(asdict(own)).encode() + b"\n")
                verdict = json.loads(_readline(sock, deadline + 15))
            except (OSError, ValueError):
                verdict = None
        if not isinstance(verdict, dict):
            return [f"preflight failed on node {own.rank}: no verdict from the master (died?)"], ""
        return [str(p) for p in verdict.get("problems") or []], "all nodes agree"
    cause = _one_line(last) if last else "timed out"
    return [
        f"preflight failed on node {own.rank}: cannot reach the master {master}:{port} within "
        f"{timeout:.0f}s ({cause}) — check security groups/firewall and MASTER_ADDR"
    ], ""


# --------------------------------------------------------------------------- the node command


def node_checks(args: argparse.Namespace, rank: int) -> tuple[list[Check], str, int | None]:
    """This node's own checks, its code hash and its GPU count."""
    checks = [check_gpus(args.expect_gpus, rank)]
    gpus = None
    if args.expect_gpus > 0:
        gpus, _ = count_gpus()
    checks += [check_path(p, rank) for p in args.require_path]
    checks.append(check_ifname(os.environ.get("NCCL_SOCKET_IFNAME"), rank))
    checks.append(check_launcher(args.launcher, rank))
    digest = code_hash(args.workdir)
    checks.append(check_code_hash(digest, args.code_hash, rank))
    if args.bucket:
        checks.append(check_bucket(args.bucket, rank))
    return checks, digest, gpus


def node_main(argv: list[str] | None = None) -> int:
    """`python -m mncloud.doctor node …`: this node's checks, then the gang check."""
    parser = argparse.ArgumentParser(prog="python -m mncloud.doctor node")
    parser.add_argument("--expect-gpus", type=int, default=0, help="GPUs per node; 0 = CPU")
    parser.add_argument("--port", type=int, default=None, help="rendezvous port (MASTER_PORT)")
    parser.add_argument("--require-path", action="append", default=[], help="must exist")
    parser.add_argument("--code-hash", default=None, help="expected workdir code hash")
    parser.add_argument("--bucket", default=None, help="check this bucket is writable")
    parser.add_argument("--workdir", default=".", help="the synced workdir")
    parser.add_argument("--launcher", default=None, help="must be on PATH (e.g. accelerate)")
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT)
    args = parser.parse_args(argv)
    start = time.monotonic()
    rank = int(os.environ.get(constants.SKYPILOT_NODE_RANK, "0") or 0)
    nodes = int(os.environ.get(constants.SKYPILOT_NUM_NODES, "1") or 1)
    ips = os.environ.get(constants.SKYPILOT_NODE_IPS, "127.0.0.1").split()
    master = os.environ.get("MASTER_ADDR") or (ips[0] if ips else "127.0.0.1")
    port = args.port or int(os.environ.get("MASTER_PORT") or constants.DEFAULT_MASTER_PORT)
    checks, digest, gpus = node_checks(args, rank)
    if nodes > 1:
        checks.append(check_resolvable(master, rank))
    own = NodeInfo(
        rank=rank,
        nodes=nodes,
        host=socket.gethostname(),
        code_hash=digest,
        gpus=gpus,
        failures=[c.detail for c in failures(checks)],
    )
    note = ""
    if nodes <= 1:
        problems = [c.line() for c in failures(checks)]
    elif rank == 0:
        problems = run_head(own, port, args.timeout)
    else:
        problems, note = run_member(own, master, port, args.timeout)
        if not problems and own.failures:  # joined a running job: own failures still count
            problems = [c.line() for c in failures(checks)]
    took = time.monotonic() - start
    if problems:
        for line in problems:
            print(line, file=sys.stderr, flush=True)
        return PREFLIGHT_FAILED_EXIT_CODE
    print(
        f"preflight ok on node {rank}/{nodes} in {took:.1f}s: code {digest}"
        + (f", {gpus} GPU(s)" if gpus is not None else "")
        + (f"; {note}" if note else ""),
        file=sys.stderr,
        flush=True,
    )
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] != "node":
        print("usage: python -m mncloud.doctor node [options]  (laptop: mncloud doctor)")
        return 2
    return node_main(argv[1:])


if __name__ == "__main__":
    sys.exit(main())
