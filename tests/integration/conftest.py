"""Fixtures of the integration tests: a private PostgreSQL server when a test asks for one."""

from __future__ import annotations

from tests.postgres import postgres_server, postgres_url

__all__ = ["postgres_server", "postgres_url"]
