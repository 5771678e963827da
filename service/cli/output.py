"""Output conventions shared by the commands: tables and results on stdout, diagnostics
(progress, warnings, errors) on stderr, JSON on stdout for scripts.

This module is imported by every command at start, so it imports no HTTP client, no
pydantic and no settings at module level: `repro --help` should not wait for them.
"""

from __future__ import annotations

import enum
import inspect
import json
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from typer.core import TyperCommand, TyperGroup

if TYPE_CHECKING:
    from rich.table import Table
    from typer._click.core import Context, Parameter

    from reprotrain import ApiError, Client

# Past this width nothing is hard-wrapped: a digest or a path stays on one line.
_UNWRAPPED = 100_000


def _console(*, stderr: bool) -> Console:
    """A console that wraps for a terminal and never hard-wraps into a file or a pipe."""
    stream = sys.stderr if stderr else sys.stdout
    if stream.isatty():
        return Console(stderr=stderr)
    return Console(stderr=stderr, width=_UNWRAPPED, soft_wrap=True)


err = _console(stderr=True)
out = _console(stderr=False)

JsonFlag = Annotated[bool, typer.Option("--json", help="machine-readable output on stdout")]


class Archived(enum.StrEnum):
    """Which a list shows: those not archived (the default), only the archived, or both."""

    false = "false"
    true = "true"
    any = "any"


ArchivedOption = Annotated[
    Archived, typer.Option(help="archived ones: false (left out), true (only them) or any")
]
ApiOption = Annotated[
    str,
    typer.Option("--api", envvar="REPRO_API_URL", help="base URL of the Reprotrain API"),
]


def _warn_token_on_command_line(ctx: typer.Context, value: str | None) -> str | None:
    # A command line is world-readable in /proc/<pid>/cmdline for as long as the command runs.
    from typer._click.core import ParameterSource

    if value and ctx.get_parameter_source("token") is ParameterSource.COMMANDLINE:
        err.print(
            "[yellow]warning:[/yellow] --token on the command line is readable by every local "
            "user in the process list; use --token-file or REPRO_TOKEN",
            highlight=False,
        )
    return value


TokenOption = Annotated[
    str | None,
    typer.Option(
        "--token",
        envvar="REPRO_TOKEN",
        callback=_warn_token_on_command_line,
        help="API bearer token (prefer --token-file or REPRO_TOKEN: a command line is public)",
    ),
]
TokenFileOption = Annotated[
    Path | None,
    typer.Option(
        "--token-file",
        envvar="REPRO_TOKEN_FILE",
        dir_okay=False,
        help="file holding the API bearer token (keep it owner-only)",
    ),
]
DEFAULT_API = os.environ.get("REPRO_API_URL", "http://127.0.0.1:8000")


def _hide_flag_types(params: list[Parameter]) -> list[Parameter]:
    # A flag takes no value, so its help row shows no value type (`--help` included).
    for param in params:
        if getattr(param, "is_flag", False) and param.metavar is None:
            param.metavar = ""
    return params


def human_size(size: int) -> str:
    """Bytes for people: "512 B", "3.4 KiB", "1.2 MiB", "2.0 GiB"."""
    value = float(size)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{size} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")  # pragma: no cover


def reflow(text: str) -> str:
    """A docstring's paragraphs, each on one line: the help wraps them to the terminal
    instead of keeping the source's line breaks mid-sentence. A line that starts a list
    item ("- ") stays a line of its own."""
    paragraphs = []
    for paragraph in inspect.cleandoc(text).split("\n\n"):
        lines: list[str] = []
        for line in paragraph.splitlines():
            if lines and not line.lstrip().startswith("- "):
                lines[-1] += " " + line.strip()
            else:
                lines.append(line.strip())
        paragraphs.append("\n".join(lines))
    return "\n\n".join(paragraphs)


class Command(TyperCommand):
    """A command whose help shows flags, `--help` included, without a value type, and its
    docstring's paragraphs reflowed."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self.help:
            self.help = reflow(self.help)

    def get_params(self, ctx: Context) -> list[Parameter]:
        return _hide_flag_types(super().get_params(ctx))


class Group(TyperGroup):
    """A command group whose help shows flags, `--help` included, without a value type."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self.help:
            self.help = reflow(self.help)

    def get_params(self, ctx: Context) -> list[Parameter]:
        return _hide_flag_types(super().get_params(ctx))


class TokenFileError(ValueError):
    """A token file that cannot be used: unreadable, empty, or beside --token."""


def read_token_file(path: Path) -> str:
    """The token a file holds (its first line, stripped); TokenFileError saying why not."""
    try:
        with path.open("rb") as fh:
            data = fh.read(_TOKEN_FILE_MAX + 1)
    except OSError as exc:
        raise TokenFileError(f"cannot read the token file {path}: {exc.strerror or exc}") from None
    text = data.decode("utf-8", "replace").strip()
    if len(data) > _TOKEN_FILE_MAX or "\n" in text:
        raise TokenFileError(f"{path} holds more than one token line")
    if not text:
        raise TokenFileError(f"the token file {path} is empty")
    return text


_TOKEN_FILE_MAX = 4096  # a token is under 100 characters; a file past this is not one


def token_from(token: str | None, token_file: Path | None) -> str | None:
    """The token of --token-file, else of --token / REPRO_TOKEN; both given is an error."""
    if token_file is None:
        return token
    if token:
        raise TokenFileError("give the token once: --token-file, or --token / REPRO_TOKEN")
    return read_token_file(token_file)


def resolve_token(token: str | None, token_file: Path | None = None) -> str | None:
    """The token of --token-file, else --token / REPRO_TOKEN, else the local embedded
    server's admin token. Exits 2 with the reason when the token file cannot be used."""
    try:
        token = token_from(token, token_file)
    except TokenFileError as exc:
        err.print(f"[red]error:[/red] {exc}", highlight=False)
        raise typer.Exit(2) from None
    if token:
        return token
    from service.auth.bootstrap import read_token_file
    from service.config import Settings

    return read_token_file(Settings().data_dir)


def repro_client(api: str, token: str | None, token_file: Path | None = None) -> Client:
    """The Python client of the API, with the given or the local token."""
    from reprotrain import Client

    return Client(api, resolve_token(token, token_file))


def api_error_lines(exc: ApiError) -> list[str]:
    """What the API said: its reason, then each field error with its path."""
    detail = exc.detail if isinstance(exc.detail, str) else json.dumps(exc.detail)
    lines = [detail]
    # The field errors (paths and messages) are what tells a person what to change.
    for item in exc.errors:
        if isinstance(item, dict):
            loc = item.get("loc")
            where = ".".join(map(str, loc)) if isinstance(loc, list) else str(loc or "")
            msg = str(item.get("msg"))
            # A message that already starts with its place is not given it twice.
            msg = msg.removeprefix(f"{where}: ") if where else msg
            lines.append(f"  {where}: {msg}" if where else f"  {msg}")
    return lines


def api_error_exit(exc: ApiError) -> typer.Exit:
    """Tell the person what the API said; exit 2 for a refused request, 1 otherwise."""
    if exc.status_code is None:
        err.print(f"[red]cannot reach the API:[/red] {exc.detail}", markup=True, highlight=False)
        return typer.Exit(1)
    first, *more = api_error_lines(exc)
    err.print(f"[red]error {exc.status_code}:[/red] ", end="", highlight=False)
    err.print("\n".join([first, *more]), markup=False, highlight=False)
    return typer.Exit(2 if 400 <= exc.status_code < 500 else 1)


def each(items: Sequence[Any], act: Callable[[Any], str], *, what: str) -> None:
    """`act` on every item, printing what it returns; a refusal is printed on stderr
    (`{what} {item}: ...`) and the others still go ahead. Exits 1 if any was refused."""
    from reprotrain import ApiError

    failed = 0
    for item in items:
        try:
            typer.echo(act(item))
        except ApiError as exc:
            failed += 1
            err.print(f"[red]{what} {item}:[/red] {exc}", highlight=False)
    raise typer.Exit(1 if failed else 0)


def delete_each(
    items: Sequence[Any], delete: Callable[[Any], None], *, what: str, yes: bool
) -> None:
    """Ask first (unless `yes`), then `delete` every item, as `each` does."""
    listed = ", ".join(map(str, items))
    if not yes and not typer.confirm(f"delete {what}s {listed} for good?"):
        raise typer.Exit(1)

    def act(item: Any) -> str:
        delete(item)
        return f"{what} {item} deleted"

    each(items, act, what=what)


def emit_json(data: Any) -> None:
    """Write one JSON document on stdout."""
    sys.stdout.write(json.dumps(data, indent=1, default=str) + "\n")


def metrics_line(row: dict[str, Any]) -> str:
    """An epoch's metrics (loss, accuracy, ...) as `name value` pairs."""
    skip = {"epoch", "step", "seconds", "event", "fingerprint", "epochs", "batch", "batches"}
    return "  ".join(
        f"{k} {v:.4f}" for k, v in row.items() if k not in skip and isinstance(v, int | float)
    )


class TrainingBar:
    """A progress bar on stderr, fed with a job's progress events (`worker.training.progress`).

    On a terminal it redraws in place; into a file or a pipe it writes one line per new
    description instead, so a log shows the epochs advance.
    """

    def __init__(self, label: str, *, quiet: bool, initial: str, total: int | None = None) -> None:
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
        )

        self._label = label
        self._quiet = quiet
        self._lines = not err.is_terminal
        self._said: str | None = None
        self._epochs_said = 0  # the last epoch a log was told had ended
        self._progress = Progress(
            TextColumn(f"{label} [progress.description]{{task.description}}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=err,
            disable=quiet or self._lines,
        )
        # A known total (a remote run's epochs) shows "0/3" while queued, not "0/?".
        self._task = self._progress.add_task(initial, total=total)
        self._say(initial)

    def __enter__(self) -> TrainingBar:
        self._progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._progress.stop()

    def _say(self, description: str, *, key: str | None = None) -> None:
        """Into a file or a pipe: write the description, once per `key` (default: itself)."""
        key = description if key is None else key
        if self._lines and not self._quiet and key != self._said:
            err.print(f"{self._label} {description}", markup=False, highlight=False)
            self._said = key

    def _update(self, description: str) -> None:
        self._progress.update(self._task, description=description)
        self._say(description)

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
            said = f"epoch {event['epoch']} done  {metrics_line(event)}".rstrip()
            self._say(said, key=f"epoch {event['epoch']}")
        elif otherwise is not None:
            self._update(otherwise)

    def show_epochs(self, event: dict[str, Any] | None, epochs: int, *, otherwise: str) -> None:
        """Show a remote run's latest progress event as epochs done of `epochs`.

        A worker reports only its job's latest event about once a second, so step totals
        may never arrive; every event but "released" names its epoch, which is enough.
        """
        kind = (event or {}).get("event")
        epoch = (event or {}).get("epoch")
        if event is None or not isinstance(epoch, int) or kind == "released":
            self._update(otherwise)
            return
        ended = kind in ("epoch_end", "interrupted") or (
            kind == "checkpoint" and event.get("kind") != "step"
        )
        done = epoch if ended else epoch - 1
        loss = f"  loss {event['loss']:.4f}" if isinstance(event.get("loss"), float) else ""
        self._progress.update(
            self._task,
            total=epochs,
            completed=done,
            description=f"epoch {min(done + 1, epochs)}/{epochs}{loss}",
        )
        # A log gets one line per finished epoch, not one per report; epochs that ended
        # between two reports get theirs too (their metrics come with the run's end).
        for skipped in range(self._epochs_said + 1, done):
            self._say(f"epoch {skipped}/{epochs} done", key=f"epoch {skipped}")
        metrics = metrics_line(event) if kind == "epoch_end" else ""
        said = f"epoch {done}/{epochs} done  {metrics}".rstrip() if done else "training"
        self._say(said, key=f"epoch {done}")
        self._epochs_said = max(self._epochs_said, done)


def text_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    """Lines of plain text, columns left-aligned and two spaces apart, for reports whose
    lines a terminal, a log or a pipe shows alike."""
    widths = [max([len(h), *(len(r[i]) for r in rows)]) for i, h in enumerate(header)]
    return [
        ("  " + "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True))).rstrip()
        for row in (header, *rows)
    ]


def unique_prefixes(values: list[str], *, shortest: int) -> list[str]:
    """Each value cut to one length, the shortest (at least `shortest` characters) at which
    distinct values stay distinct; a cut value ends in "…"."""
    distinct = set(values)
    longest = max((len(v) for v in values), default=0)
    n = min(shortest, longest)
    while n < longest and len({v[:n] for v in distinct}) < len(distinct):
        n += 1
    return [v if len(v) <= n else v[:n] + "…" for v in values]


def print_table(
    make: Callable[[list[str]], Table], values: list[str], *, column: int, shortest: int
) -> None:
    """Print on stdout the table `make` builds around `values` (digests, fingerprints) in its
    `column`: whole, unless stdout is a terminal too narrow for them, then cut to unique
    prefixes."""
    table = make(values)
    # Measured within the terminal's width, a table never exceeds it: measure it unbounded.
    unbounded = out.options.update_width(_UNWRAPPED)
    if out.is_terminal and out.measure(table, options=unbounded).maximum > out.width:
        shown = unique_prefixes(values, shortest=shortest)
        table = make(shown)
        _give_way(table, column, keep=max((len(v) for v in shown), default=0))
    if not out.is_terminal:
        # Into a pipe or a file: plain columns for grep, awk and cut, not box drawing.
        table.box, table.show_edge, table.pad_edge = None, False, False
    out.print(table)


def _give_way(table: Table, column: int, *, keep: int) -> None:
    """Cap the other columns at equal shares of the width `column` leaves, so `column` keeps
    `keep` characters: squeezed to fit, rich cuts every column alike, prefixes included."""
    key = table.columns[column]
    key.no_wrap, key.min_width = True, keep
    others = [c for i, c in enumerate(table.columns) if i != column]
    borders = len(table.columns) + 1
    padding = 2 * len(table.columns)  # one space each side of a cell
    share = (out.width - borders - padding - keep) // max(len(others), 1)
    for other in others:
        other.max_width = max(share, 1) + 2
