"""The web app of `mncloud ui`: a small FastAPI router over `mncloud.ui.views`.

Read-only (GET and HEAD; anything else is 405), every page drawn by Jinja2 with autoescape
on, a Content-Security-Policy that lets only the page's own inline script run (by nonce), and,
when a token is set, the token required on every request: `?token=…` once (it is then kept in
a cookie) or the cookie itself.
"""

from __future__ import annotations

import secrets
from pathlib import Path
from typing import Any

import jinja2
from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, JSONResponse, Response
from fastapi.templating import Jinja2Templates
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.middleware.trustedhost import TrustedHostMiddleware

from mncloud.errors import RunNotFoundError
from mncloud.ui import curves, svg, views

TEMPLATES = Path(__file__).resolve().parents[1] / "templates" / "ui"
COOKIE = "mncloud_ui_token"
#: Seconds between refreshes of a page whose run is going, and between log polls.
REFRESH_S = 10
POLL_MS = 1000
#: Log lines a page shows (the newest).
LOG_TAIL = 300


def _templates() -> Jinja2Templates:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(TEMPLATES), autoescape=True, undefined=jinja2.StrictUndefined
    )
    return Jinja2Templates(env=env)


def _authorized(request: Request, token: str | None) -> tuple[bool, bool]:
    """(allowed, given in the URL) for a request under `token` (None: no token needed)."""
    if token is None:
        return True, False
    given = request.query_params.get("token")
    if given is not None and secrets.compare_digest(given.encode(), token.encode()):
        return True, True
    cookie = request.cookies.get(COOKIE)
    return cookie is not None and secrets.compare_digest(cookie.encode(), token.encode()), False


def create_app(token: str | None = None, allowed_hosts: list[str] | None = None) -> FastAPI:
    """The app; with `token`, every request must carry it; with `allowed_hosts`, requests
    naming another Host are refused (DNS rebinding)."""
    app = FastAPI(title="mncloud", docs_url=None, redoc_url=None, openapi_url=None)
    templates = _templates()
    if allowed_hosts:
        app.add_middleware(TrustedHostMiddleware, allowed_hosts=allowed_hosts)

    def page(request: Request, template: str, status_code: int = 200, **context: Any) -> Response:
        nonce = secrets.token_urlsafe(16)
        context.update(nonce=nonce, refresh_s=REFRESH_S, poll_ms=POLL_MS)
        context.setdefault("refresh", False)
        response = templates.TemplateResponse(request, template, context, status_code=status_code)
        response.headers["Content-Security-Policy"] = (
            f"default-src 'none'; script-src 'nonce-{nonce}'; style-src 'unsafe-inline'; "
            "img-src 'self' data:; connect-src 'self'; base-uri 'none'; form-action 'self'"
        )
        return response

    @app.middleware("http")
    async def guard(request: Request, call_next: Any) -> Response:
        if request.method not in ("GET", "HEAD"):
            return Response("read-only: GET only\n", status_code=405, headers={"Allow": "GET"})
        allowed, in_url = _authorized(request, token)
        if not allowed:
            return Response("a token is needed: open the URL `mncloud ui` printed\n", 401)
        response: Response = await call_next(request)
        response.headers.setdefault("X-Content-Type-Options", "nosniff")
        response.headers.setdefault("X-Frame-Options", "DENY")
        response.headers.setdefault("Referrer-Policy", "no-referrer")
        if in_url and token is not None:
            response.set_cookie(COOKIE, token, httponly=True, samesite="strict")
        return response

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> Response:
        return page(
            request, "error.html.j2", exc.status_code, title=f"{exc.status_code}",
            message=str(exc.detail),
        )  # fmt: skip

    @app.exception_handler(RunNotFoundError)
    async def not_found(request: Request, exc: RunNotFoundError) -> Response:
        return page(request, "error.html.j2", 404, title="404: not found", message=str(exc))

    @app.exception_handler(Exception)
    async def failed(request: Request, exc: Exception) -> Response:
        message = f"{type(exc).__name__}: {' '.join(str(exc).split())[:300]}"
        return page(request, "error.html.j2", 500, title="500: cannot draw it", message=message)

    @app.get("/", response_class=HTMLResponse)
    def runs(request: Request) -> Response:
        rows = views.run_rows()
        going = any(r.state in ("PENDING", "STARTING", "RUNNING", "RECOVERING") for r in rows)
        return page(request, "runs.html.j2", rows=rows, refresh=going)

    @app.get("/runs/{name}", response_class=HTMLResponse)
    def run(request: Request, name: str) -> Response:
        data = views.run_page(name)
        ledger = data["ledger"]
        chart = None
        if ledger is not None:
            parts = {k: p.node_seconds for k, p in ledger.parts.items()}
            chart = svg.breakdown_svg(parts, ledger.total_node_seconds)
        return page(
            request, "run.html.j2", **data, timeline_svg=svg.timeline_svg(data["timeline"]),
            breakdown_svg=chart, refresh=data["running"],
            curve_svgs=curves.curve_charts(data["metrics"]) if data["metrics"] else {},
        )  # fmt: skip

    @app.get("/runs/{name}/logs")
    def logs(name: str, node: int | None = None, tail: int = LOG_TAIL) -> JSONResponse:
        try:
            lines = views.log_lines(name, node, max(1, min(tail, 5000)))
        except RunNotFoundError:
            raise
        except views.READ_ERRORS as err:  # a node the run does not have, a log gone
            return JSONResponse({"lines": [], "error": str(err)})
        return JSONResponse({"lines": lines, "error": None})

    return app
