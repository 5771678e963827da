"""How the API's routes read request bodies: JSON as RFC 8259 defines it, within bounds."""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Coroutine
from typing import Any, NoReturn

from fastapi import HTTPException, Request, Response
from fastapi.routing import APIRoute

from service.json_bounds import MAX_INT_DIGITS


def _refuse_constant(name: str) -> NoReturn:
    # Python's json reads NaN and Infinity; databases (PostgreSQL's json) and clients do not.
    raise json.JSONDecodeError(f"{name} is not a JSON value", name, 0)


class _NumberOutOfRange(ValueError):
    """A well-formed JSON number this server does not accept (answered with 422)."""


def _bounded_int(text: str) -> int:
    # Past the limit int() raises a bare ValueError deep inside json.loads (a 500 before).
    digits = len(text.lstrip("-"))
    if digits > MAX_INT_DIGITS:
        raise _NumberOutOfRange(
            f"a JSON integer has {digits} digits; this server accepts at most {MAX_INT_DIGITS}"
        )
    return int(text)


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):  # 1e999 reads as infinity, which JSON cannot hold
        raise _NumberOutOfRange(f"the JSON number {text[:40]} is out of the range of a double")
    return value


def parse_json(body: bytes | str) -> Any:
    """The JSON value of a body: json.JSONDecodeError (400) when it is not JSON, nests too
    deeply or holds NaN; HTTPException 422 for a number out of range."""
    try:
        return json.loads(
            body,
            parse_constant=_refuse_constant,
            parse_int=_bounded_int,
            parse_float=_finite_float,
        )
    except RecursionError:  # the parser recurses once per level of nesting
        raise json.JSONDecodeError("the JSON nests too deeply", "", 0) from None
    except _NumberOutOfRange as exc:
        # An HTTPException is the one kind FastAPI lets out of its body reading unchanged.
        raise HTTPException(status_code=422, detail=str(exc)) from None


class JsonRequest(Request):
    """A request whose JSON body is strict and bounded (see `parse_json`)."""

    async def json(self) -> Any:
        if not hasattr(self, "_json"):
            self._json = parse_json(await self.body())
        return self._json


class JsonRoute(APIRoute):
    """The route class of every API router: its endpoint sees a JsonRequest."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def strict_json_handler(request: Request) -> Response:
            return await handler(JsonRequest(request.scope, request.receive))

        return strict_json_handler
