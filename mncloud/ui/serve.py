"""Serving the web view: which host and port, which token, then uvicorn.

Loopback by default; any other address requires a token (one is generated when none is
given), so a page reachable from the network never opens without it. The port is checked by
binding it first, so a port in use is one line that names it and suggests a free one.
"""

from __future__ import annotations

import ipaddress
import secrets
import socket
from dataclasses import dataclass

from mncloud.errors import MncloudError

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8765
LOOPBACK_NAMES = ("localhost",)


class UiError(MncloudError):
    """`mncloud ui` cannot serve as asked."""


@dataclass(frozen=True)
class Binding:
    """Where to serve, and the token every request must carry (None on loopback)."""

    host: str
    port: int
    token: str | None
    generated: bool = False

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        query = f"/?token={self.token}" if self.token else "/"
        return f"http://{host}:{self.port}{query}"


def is_loopback(host: str) -> bool:
    """Whether `host` (an IP address or `localhost`) is this machine only."""
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def binding(host: str, port: int, token: str | None) -> Binding:
    """Check host, port range and token: a non-loopback host needs a token (generated when
    none is given); a host must be an IP address or `localhost` (no name lookups)."""
    if not is_loopback(host):
        try:
            ipaddress.ip_address(host)
        except ValueError:
            raise UiError(
                f"--host {host!r}: give an IP address to bind (127.0.0.1, 0.0.0.0, ::) or localhost"
            ) from None
    if not 1 <= port <= 65535:
        raise UiError(f"--port {port}: give a port from 1 to 65535 (e.g. {DEFAULT_PORT})")
    if token is not None and (len(token) < 16 or not token.isprintable() or " " in token):
        raise UiError("--token: give at least 16 printable characters without spaces")
    if token is None and not is_loopback(host):
        return Binding(host, port, secrets.token_urlsafe(24), generated=True)
    return Binding(host, port, token)


def require_extra() -> None:
    """UiError, saying how to install them, when FastAPI or uvicorn is missing."""
    try:
        import fastapi  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as err:
        raise UiError(f"mncloud ui needs the [ui] extra ({err.name} is missing): "
                      "pip install 'mncloud[ui]'") from None  # fmt: skip


def free_port(host: str = DEFAULT_HOST) -> int:
    """A port free on `host` now."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def check_port(host: str, port: int) -> None:
    """UiError, naming the port and a free one, when `host:port` cannot be bound."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as err:
            if err.errno in (98, 13):  # EADDRINUSE, EACCES
                why = "is in use" if err.errno == 98 else "needs privileges"
                try:
                    other = f"; try --port {free_port(host)}"
                except OSError:
                    other = ""
                raise UiError(f"port {port} on {host} {why}{other}") from None
            raise UiError(f"cannot bind {host}:{port}: {err.strerror}") from None


def allowed_hosts(bound: Binding) -> list[str] | None:
    """The Host headers a loopback server answers (DNS rebinding); None: any (token)."""
    if not is_loopback(bound.host):
        return None
    return ["127.0.0.1", "localhost", "[::1]", "::1", bound.host]


def serve(bound: Binding) -> None:
    """Serve until interrupted (uvicorn, one process)."""
    import uvicorn

    from mncloud.ui.app import create_app

    app = create_app(token=bound.token, allowed_hosts=allowed_hosts(bound))
    uvicorn.run(
        app, host=bound.host, port=bound.port, log_level="warning", access_log=False, ws="none"
    )
