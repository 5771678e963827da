"""The app in this process, and an HTTP client per token, for tests that drive the API
through its routes without a server."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import httpx

from service.app import create_app
from service.auth.tokens import Role, create_token
from service.config import Settings

Clients = dict[str, httpx.AsyncClient]


def with_clients(
    settings: Settings,
    tokens: Mapping[str, Role],
    body: Callable[[Any, Clients], Awaitable[None]],
) -> None:
    """Run `body(app, clients)`: one client per entry of `tokens` (name: role), each with a
    new token of that role, all closed afterwards."""
    app = create_app(settings)
    with app.state.sessionmaker() as db:
        secrets = {
            name: create_token(db=db, name=name, role=role)[1] for name, role in tokens.items()
        }

    async def main() -> None:
        transport = httpx.ASGITransport(app=app)
        clients = {
            name: httpx.AsyncClient(
                transport=transport,
                base_url="http://api",
                headers={"Authorization": f"Bearer {secret}"},
                timeout=60,
            )
            for name, secret in secrets.items()
        }
        try:
            await body(app, clients)
        finally:
            for client in clients.values():
                await client.aclose()

    try:
        asyncio.run(main())
    finally:
        app.state.engine.dispose()


def same_app(client: httpx.AsyncClient, token: str) -> httpx.AsyncClient:
    """Another client of the app `client` talks to, authenticated with `token`."""
    return httpx.AsyncClient(
        transport=client._transport,  # the app's ASGI transport: no public accessor
        base_url="http://api",
        headers={"Authorization": f"Bearer {token}"},
    )
