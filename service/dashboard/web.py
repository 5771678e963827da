"""What every dashboard page shares: templates, the page route class, who is looking."""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Callable, Coroutine
from datetime import datetime
from typing import Annotated, Any

from fastapi import Depends, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, RedirectResponse
from fastapi.routing import APIRoute
from jinja2 import Environment, PackageLoader, select_autoescape
from markupsafe import Markup

from service.api.deps import ReadSessionDep
from service.dashboard.session import LoginRequired, Viewer, login_url, sessions_of
from service.errors import ServiceError

# Pages load only their own files; nothing inline runs, nothing comes from elsewhere.
CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
)
SECURITY_HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}


def short(value: object, n: int = 12) -> str:
    """A digest without its algorithm prefix, cut to n characters (empty for None)."""
    if not value:
        return ""
    text = str(value)
    return text.split(":", 1)[-1][:n] if ":" in text else text[:n]


def when(value: datetime | None) -> str:
    return value.strftime("%Y-%m-%d %H:%M:%S") if value else ""


def duration(start: datetime | None, end: datetime | None) -> str:
    if start is None or end is None:
        return ""
    seconds = int((end - start).total_seconds())
    if seconds < 60:
        return f"{seconds} s"
    if seconds < 3600:
        return f"{seconds // 60} min {seconds % 60} s"
    return f"{seconds // 3600} h {seconds % 3600 // 60} min"


def size(value: int | None) -> str:
    if value is None:
        return ""
    amount = float(value)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if amount < 1024 or unit == "GiB":
            return f"{amount:.0f} {unit}" if unit == "B" else f"{amount:.1f} {unit}"
        amount /= 1024
    return str(value)


def pretty(value: object) -> str:
    """A value as an auditor reads it: JSON for structures, the text otherwise."""
    if value is None:
        return "—"
    if isinstance(value, dict | list):
        return json.dumps(value, sort_keys=True)
    if isinstance(value, bool):
        return "yes" if value else "no"
    return str(value)


def finite(value: object) -> float | None:
    """A stored number as a float; None for anything else (text, a list, a flag, or an integer
    no double holds), so an odd value a worker stored earlier never breaks a page."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        amount = float(value)
    except OverflowError:
        return None
    return amount if math.isfinite(amount) else None


def number(value: object) -> str:
    if isinstance(value, float):
        return f"{value:.6g}"
    if isinstance(value, int) and not isinstance(value, bool) and finite(value) is None:
        return "(out of range)"  # str() of a 4,000-digit integer is slow and says nothing
    return pretty(value)


@functools.cache
def environment() -> Environment:
    """The dashboard's Jinja2 environment (autoescaped: everything shown is text)."""
    env = Environment(
        loader=PackageLoader("service.dashboard", "templates"),
        autoescape=select_autoescape(default=True, default_for_string=True),
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters.update(
        short=short, when=when, size=size, pretty=pretty, number=number, duration=duration
    )
    env.globals["duration"] = duration
    return env


def render(
    request: Request,
    template: str,
    viewer: Viewer | None,
    status_code: int = 200,
    headers: dict[str, str] | None = None,
    **context: Any,
) -> HTMLResponse:
    """A rendered page with the dashboard's security headers."""
    html = environment().get_template(template).render(request=request, viewer=viewer, **context)
    return HTMLResponse(
        html, status_code=status_code, headers={**SECURITY_HEADERS, **(headers or {})}
    )


def svg(markup: str) -> Markup:
    """Server-drawn SVG, built from escaped parts by `service.dashboard.charts`."""
    return Markup(markup)


class PageRoute(APIRoute):
    """Routes of the dashboard: errors answer as HTML pages, a missing session with a
    redirect to the login page (303), or 401 to a partial-page request."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def page_handler(request: Request) -> Response:
            try:
                return await handler(request)
            except LoginRequired as exc:
                if request.headers.get("HX-Request") or request.method != "GET":
                    if request.method == "GET":
                        return Response(
                            str(exc), status_code=401, headers={"HX-Redirect": "/login"}
                        )
                    target = login_url(request.headers.get("HX-Current-URL") or "/")
                    return RedirectResponse(target, status_code=303)
                path = request.url.path + (f"?{request.url.query}" if request.url.query else "")
                return RedirectResponse(login_url(path), status_code=303)
            except RequestValidationError as exc:
                problems = "; ".join(
                    f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors()
                )
                return render(
                    request, "error.html", None, status_code=422, message=problems, code=422
                )
            except ServiceError as exc:
                headers = {}
                if exc.retry_after is not None:
                    headers["Retry-After"] = str(max(exc.retry_after, 1))
                return render(
                    request,
                    "error.html",
                    None,
                    status_code=exc.status_code,
                    headers=headers,
                    message=str(exc),
                    code=exc.status_code,
                )

        return page_handler


def get_viewer(request: Request, db: ReadSessionDep) -> Viewer:
    """The logged-in viewer (any role that may read); LoginRequired otherwise."""
    return sessions_of(request).viewer(request, db)


ViewerDep = Annotated[Viewer, Depends(get_viewer)]
