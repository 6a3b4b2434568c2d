"""The gang check: node 0 listens on the rendezvous port, every node says hello, one verdict
(the design is in `mncloud.doctor`'s docstring)."""

from __future__ import annotations

import contextlib
import json
import socket
import time
from dataclasses import asdict, dataclass

from mncloud.doctor.checks import GREETING, _one_line

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
