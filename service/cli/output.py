"""Output conventions shared by the commands: JSON on stdout for scripts, people on stderr."""

from __future__ import annotations

import json
import os
import sys
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from worker.node.client import ApiClient, ApiError

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
    from service.auth.bootstrap import read_token_file
    from service.config import Settings

    return read_token_file(Settings().data_dir)


def api_client(api: str, token: str | None) -> ApiClient:
    """A client of the API with the given or the local token."""
    return ApiClient(api, resolve_token(token))


def api_error_exit(exc: ApiError) -> typer.Exit:
    """Tell the person what the API said; exit 2 for a refused request, 1 otherwise."""
    if exc.status_code is None:
        err.print(f"[red]cannot reach the API:[/red] {exc.detail}")
        return typer.Exit(1)
    err.print(f"[red]error {exc.status_code}:[/red] {exc.detail}")
    return typer.Exit(2 if 400 <= exc.status_code < 500 else 1)


def emit_json(data: Any) -> None:
    """Write one JSON document on stdout."""
    sys.stdout.write(json.dumps(data, indent=1, default=str) + "\n")


class TrainingBar:
    """A progress bar on stderr, fed with a job's progress events (`worker.training.progress`)."""

    def __init__(self, label: str, *, quiet: bool, initial: str) -> None:
        self._progress = Progress(
            TextColumn(f"{label} [progress.description]{{task.description}}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=err,
            disable=quiet,
        )
        self._task = self._progress.add_task(initial, total=None)

    def __enter__(self) -> TrainingBar:
        self._progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._progress.stop()

    def show(self, event: dict[str, Any] | None, *, otherwise: str | None = None) -> None:
        """Show a step or epoch event; for any other, show `otherwise` if given."""
        kind = (event or {}).get("event")
        if event is not None and kind == "step":
            self._progress.update(
                self._task,
                total=event["epochs"] * event["batches"],
                completed=event["step"],
                description=f"epoch {event['epoch']}/{event['epochs']} loss {event['loss']:.4f}",
            )
        elif event is not None and kind == "epoch_end":
            self._progress.update(self._task, completed=event["step"])
        elif otherwise is not None:
            self._progress.update(self._task, description=otherwise)
