"""A synchronous HTTP client for an ASGI app that keeps cookies, as a browser would."""

from __future__ import annotations

import asyncio
import re
from typing import Any

import httpx


def hidden_value(html: str, name: str) -> str:
    """The value of the form field `name` in a page (a login form's token, a CSRF token)."""
    found = re.search(rf'name="{re.escape(name)}" value="([^"]+)"', html)
    assert found is not None, html[:2000]
    return found.group(1)


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

    def patch(self, url: str, **kwargs: Any) -> httpx.Response:
        return self.request("PATCH", url, **kwargs)

    def delete(self, url: str, **kwargs: Any) -> httpx.Response:
        return self.request("DELETE", url, **kwargs)

    def login(self, token: str) -> httpx.Response:
        """Fill in the login form with `token`; the answer (a 303 on success)."""
        form_token = hidden_value(self.get("/login").text, "form_token")
        return self.post("/login", data={"token": token, "form_token": form_token})

    def csrf(self, url: str = "/") -> str:
        """The CSRF token the page at `url` puts in its forms."""
        return hidden_value(self.get(url).text, "csrf")

    def close(self) -> None:
        self.loop.run_until_complete(self.client.aclose())
        self.loop.close()
