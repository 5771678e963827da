"""`repro code push | list | show`: code bundles (wheels of your own components) by digest."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from service.cli import by_digest as stored
from service.cli.output import (
    DEFAULT_API,
    ApiOption,
    Archived,
    ArchivedOption,
    Command,
    Group,
    JsonFlag,
    TokenFileOption,
    TokenOption,
    err,
    human_size,
    repro_client,
)

code_app = typer.Typer(
    cls=Group,
    help="Push code bundles (a wheel of your layers, generators, models) and find them by digest.",
    no_args_is_help=True,
)


def _entry_points(record: stored.Answer) -> str:
    found = record.get("entry_points") or []
    assert isinstance(found, list)
    return ", ".join(f"{e['group'].removeprefix('reprotrain.')}:{e['name']}" for e in found)


@code_app.command("push", cls=Command)
def push(
    source: Annotated[
        Path,
        typer.Argument(exists=True, readable=True, help="a project directory or a .whl file"),
    ],
    name: Annotated[str | None, typer.Option(help="a label (default: the wheel's name)")] = None,
    api: ApiOption = DEFAULT_API,
    token: TokenOption = None,
    token_file: TokenFileOption = None,
    as_json: JsonFlag = False,
) -> None:
    """Build a wheel of a project directory (offline), or take one, upload it, and print its
    digest for the spec's `code`."""
    if not source.is_dir() and source.suffix != ".whl":
        err.print(f"{source} is neither a project directory nor a .whl file", markup=False)
        raise typer.Exit(2)
    try:
        record = stored.fetched(
            lambda: repro_client(api, token, token_file).code.push(source, name=name)
        )
    except ValueError as exc:  # building the project's wheel failed: pip's reason
        err.print(str(exc), markup=False, highlight=False)
        raise typer.Exit(1) from None
    stored.pushed(record, as_json=as_json, summary=_summary)


def _summary(record: stored.Answer) -> str:
    return f"{record['name']}: {len(record['files'])} files; {_entry_points(record)}"


@code_app.command("list", cls=Command)
def list_(
    limit: stored.LimitOption = 50,
    archived: ArchivedOption = Archived.false,
    api: ApiOption = DEFAULT_API,
    token: TokenOption = None,
    token_file: TokenFileOption = None,
    as_json: JsonFlag = False,
) -> None:
    """Code bundles stored on the API, newest first."""
    page = stored.fetched(
        lambda: repro_client(api, token, token_file).code.page(limit=limit, archived=archived.value)
    )
    headers = ("name", "size", "components", "pushed by", "when")
    stored.listed(page, as_json=as_json, headers=headers, cells=_cells)


def _cells(b: stored.Answer) -> list[str]:
    return [b["name"], human_size(b["size"]), _entry_points(b), b["pushed_by"], b["created_at"]]


@code_app.command("show", cls=Command)
def show(
    digest: stored.DigestArgument,
    api: ApiOption = DEFAULT_API,
    token: TokenOption = None,
    token_file: TokenFileOption = None,
    as_json: JsonFlag = False,
) -> None:
    """One bundle: its files with their digests, its components, which runs used it."""
    record = stored.fetched(lambda: repro_client(api, token, token_file).code.get(digest))
    stored.shown(record, as_json=as_json, lines=_lines)


def _lines(record: stored.Answer) -> list[str]:
    files = [f"file        {f['path']}  sha256:{f['sha256']}" for f in record["files"]]
    return [
        f"digest      {record['digest']}",
        f"name        {record['name']} ({record['wheel_filename']}, {human_size(record['size'])})",
        f"components  {_entry_points(record)}",
        *files,
        f"pushed by   {record['pushed_by']} at {record['created_at']}",
        stored.runs_line(record, width=12, more=False),
    ]


stored.add_archive_commands(code_app, kind="code", noun="code bundle")


def register(app: typer.Typer) -> None:
    """Add this module's commands to the application."""
    app.add_typer(code_app, name="code")
