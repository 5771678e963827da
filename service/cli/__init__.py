"""`repro`: the command line of Reprotrain."""

from __future__ import annotations

from service.cli.app import app


def main() -> None:
    """Console-script entry point."""
    app()
