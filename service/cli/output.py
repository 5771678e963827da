"""Output conventions shared by the commands: JSON on stdout for scripts, people on stderr."""

from __future__ import annotations

import json
import os
import sys
from typing import Annotated, Any

import typer
from rich.console import Console

err = Console(stderr=True)

JsonFlag = Annotated[bool, typer.Option("--json", help="machine-readable output on stdout")]
ApiOption = Annotated[
    str,
    typer.Option("--api", envvar="REPRO_API_URL", help="base URL of the Reprotrain API"),
]
TokenOption = Annotated[
    str | None, typer.Option("--token", envvar="REPRO_TOKEN", help="API bearer token")
]
DEFAULT_API = os.environ.get("REPRO_API_URL", "http://127.0.0.1:8000")


def resolve_token(token: str | None) -> str | None:
    """The given token, else REPRO_TOKEN, else the local embedded server's admin token."""
    if token:
        return token
    from service.config import Settings
    from service.tokens_bootstrap import read_token_file

    return read_token_file(Settings().data_dir)


def emit_json(data: Any) -> None:
    """Write one JSON document on stdout."""
    sys.stdout.write(json.dumps(data, indent=1, default=str) + "\n")
