"""How the API's routes read request bodies: JSON as RFC 8259 defines it."""

from __future__ import annotations

import json
from collections.abc import Callable, Coroutine
from typing import Any, NoReturn

from fastapi import Request, Response
from fastapi.routing import APIRoute


def _refuse_constant(name: str) -> NoReturn:
    # Python's json reads NaN and Infinity; databases (PostgreSQL's json) and clients do not.
    raise json.JSONDecodeError(f"{name} is not a JSON value", name, 0)


class JsonRequest(Request):
    """A request whose JSON body may not contain NaN, Infinity or -Infinity (400)."""

    async def json(self) -> Any:
        if not hasattr(self, "_json"):
            self._json = json.loads(await self.body(), parse_constant=_refuse_constant)
        return self._json


class JsonRoute(APIRoute):
    """The route class of every API router: its endpoint sees a JsonRequest."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def strict_json_handler(request: Request) -> Response:
            return await handler(JsonRequest(request.scope, request.receive))

        return strict_json_handler
