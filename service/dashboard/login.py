"""Logging in with a token (or a one-time code of the embedded server), and out."""

from __future__ import annotations

import contextlib
import hmac
import secrets
from typing import Annotated

from fastapi import APIRouter, Query, Request, Response
from fastapi.responses import HTMLResponse, RedirectResponse
from starlette.concurrency import run_in_threadpool

from service.api.deps import SessionDep
from service.auth.tokens import Principal
from service.dashboard.session import (
    LOGIN_COOKIE,
    SESSION_COOKIE,
    LoginRequired,
    Sessions,
    read_form,
    redeem_code,
    safe_next,
    sessions_of,
    verify_login,
)
from service.dashboard.web import PageRoute, render
from service.errors import Forbidden, RateLimited, Unauthorized

router = APIRouter(route_class=PageRoute)


def _secure(request: Request) -> bool:
    return request.url.scheme == "https"


def _start_session(request: Request, principal: Principal, target: str) -> RedirectResponse:
    sessions = sessions_of(request)
    response = RedirectResponse(safe_next(target), status_code=303)
    response.set_cookie(
        SESSION_COOKIE,
        sessions.cookie_for(principal),
        max_age=sessions.max_age,
        httponly=True,
        samesite="lax",
        secure=_secure(request),
        path="/",
    )
    response.delete_cookie(LOGIN_COOKIE, path="/login")
    return response


def _login_form(
    request: Request, sessions: Sessions, target: str, message: str | None, status: int
) -> HTMLResponse:
    # Login CSRF: the form carries an HMAC of a nonce held in a cookie of this browser.
    nonce = secrets.token_urlsafe(16)
    response = render(
        request,
        "login.html",
        None,
        status_code=status,
        next=safe_next(target),
        form_token=sessions.mac("login", nonce),
        message=message,
    )
    response.set_cookie(
        LOGIN_COOKIE,
        nonce,
        max_age=3600,
        httponly=True,
        samesite="lax",
        secure=_secure(request),
        path="/login",
    )
    return response


@router.get("/login", response_class=HTMLResponse)
def login_page(
    request: Request,
    db: SessionDep,
    next: Annotated[str, Query(max_length=2000)] = "/",
    code: Annotated[str | None, Query(max_length=100)] = None,
) -> Response:
    """The login form; with a one-time `code` of the embedded server, a session at once."""
    sessions = sessions_of(request)
    if code is not None:
        principal = redeem_code(db, code)
        if principal is not None:
            return _start_session(request, principal, next)
        message = "That login link was already used or has expired. Log in with a token."
        return _login_form(request, sessions, next, message, 401)
    return _login_form(request, sessions, next, None, 200)


@router.post("/login", response_class=HTMLResponse)
async def login(request: Request) -> Response:
    """Check the token typed in; a session cookie and the page asked for, or the form again."""
    sessions = sessions_of(request)
    form = await read_form(request)
    target = form.get("next", "/")
    nonce = request.cookies.get(LOGIN_COOKIE, "")
    if not nonce or not hmac.compare_digest(
        form.get("form_token", ""), sessions.mac("login", nonce)
    ):
        return _login_form(request, sessions, target, "The form expired; try again.", 403)

    def check() -> Principal:
        with request.app.state.sessionmaker() as db:
            return verify_login(request, db, form.get("token", ""))

    try:
        principal = await run_in_threadpool(check)
    except (Unauthorized, Forbidden) as exc:
        return _login_form(request, sessions, target, f"Not logged in: {exc}.", exc.status_code)
    except RateLimited as exc:
        return _login_form(request, sessions, target, str(exc), 429)
    return _start_session(request, principal, target)


@router.post("/logout")
async def logout(request: Request) -> Response:
    """End the session (the cookie is dropped) and go back to the login form."""
    sessions = sessions_of(request)
    form = await read_form(request)

    def check() -> None:
        # Without a valid session there is nothing to end; a wrong CSRF token is refused.
        with request.app.state.sessionmaker() as db, contextlib.suppress(LoginRequired):
            sessions.check_csrf(sessions.viewer(request, db), form)

    await run_in_threadpool(check)
    response = RedirectResponse("/login", status_code=303)
    response.delete_cookie(SESSION_COOKIE, path="/")
    return response
