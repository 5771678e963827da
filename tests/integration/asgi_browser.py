"""A synchronous HTTP client for an ASGI app that keeps cookies, as a browser would."""

from __future__ import annotations

import asyncio
import re
from typing import Any

import httpx


class AsgiBrowser:
    """Requests straight into the app (no server, no sockets), one event loop per browser."""

    def __init__(self, app: Any, base_url: str = "http://dashboard.test") -> None:
        self.loop = asyncio.new_event_loop()
        self.client = httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url=base_url, timeout=60
        )

    def request(self, method: str, url: str, **kwargs: Any) -> httpx.Response:
        return self.loop.run_until_complete(self.client.request(method, url, **kwargs))

    def get(self, url: str, **kwargs: Any) -> httpx.Response:
        return self.request("GET", url, **kwargs)

    def post(self, url: str, **kwargs: Any) -> httpx.Response:
        return self.request("POST", url, **kwargs)

    def login(self, token: str) -> httpx.Response:
        """Fill in the login form with `token`; the answer (a 303 on success)."""
        form = self.get("/login")
        field = re.search(r'name="form_token" value="([^"]+)"', form.text)
        assert field is not None, form.text
        return self.post("/login", data={"token": token, "form_token": field.group(1)})

    def csrf(self, url: str = "/") -> str:
        """The CSRF token the page at `url` puts in its forms."""
        page = self.get(url)
        found = re.search(r'name="csrf" value="([^"]+)"', page.text)
        assert found is not None, page.text[:2000]
        return found.group(1)

    def close(self) -> None:
        self.loop.run_until_complete(self.client.aclose())
        self.loop.close()
