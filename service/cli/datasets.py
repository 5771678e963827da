"""`repro dataset push | list | show`: datasets stored by digest on the API."""

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
    human_size,
    repro_client,
)

dataset_app = typer.Typer(
    cls=Group,
    help="Push datasets (.npz of named arrays) and find them by digest.",
    no_args_is_help=True,
)


def _arrays(record: stored.Answer) -> str:
    arrays = record.get("arrays") or []
    assert isinstance(arrays, list)
    return ", ".join(f"{a['name']} {a['dtype']}{a['shape']}" for a in arrays)


@dataset_app.command("push", cls=Command)
def push(
    file: Annotated[
        Path, typer.Argument(exists=True, dir_okay=False, readable=True, help="an .npz file")
    ],
    name: Annotated[str | None, typer.Option(help="a label (default: the file name)")] = None,
    api: ApiOption = DEFAULT_API,
    token: TokenOption = None,
    token_file: TokenFileOption = None,
    as_json: JsonFlag = False,
) -> None:
    """Upload a dataset (streamed, with its SHA-256) and print its digest for `dataset.data`."""
    record = stored.fetched(
        lambda: repro_client(api, token, token_file).datasets.push(file, name=name or file.name)
    )
    stored.pushed(record, as_json=as_json, summary=_summary)


def _summary(record: stored.Answer) -> str:
    return f"{record['name']}: {record['samples']} samples; {_arrays(record)}"


@dataset_app.command("list", cls=Command)
def list_(
    limit: stored.LimitOption = 50,
    archived: ArchivedOption = Archived.false,
    api: ApiOption = DEFAULT_API,
    token: TokenOption = None,
    token_file: TokenFileOption = None,
    as_json: JsonFlag = False,
) -> None:
    """Datasets stored on the API, newest first.

    Digests are printed whole, unless stdout is a terminal too narrow for them: then as
    prefixes unique among those listed.
    """
    page = stored.fetched(
        lambda: repro_client(api, token, token_file).datasets.page(
            limit=limit, archived=archived.value
        )
    )
    headers = ("name", "samples", "size", "arrays", "pushed by", "when")
    stored.listed(page, as_json=as_json, headers=headers, cells=_cells)


def _cells(d: stored.Answer) -> list[str]:
    return [
        d["name"],
        str(d["samples"]),
        human_size(d["size"]),
        _arrays(d),
        d["pushed_by"],
        d["created_at"],
    ]


@dataset_app.command("show", cls=Command)
def show(
    digest: stored.DigestArgument,
    api: ApiOption = DEFAULT_API,
    token: TokenOption = None,
    token_file: TokenFileOption = None,
    as_json: JsonFlag = False,
) -> None:
    """One dataset: its arrays with shapes and dtypes, who pushed it, which runs used it."""
    record = stored.fetched(lambda: repro_client(api, token, token_file).datasets.get(digest))
    stored.shown(record, as_json=as_json, lines=_lines)


def _lines(record: stored.Answer) -> list[str]:
    arrays = [f"array      {a['name']}: {a['dtype']} {tuple(a['shape'])}" for a in record["arrays"]]
    return [
        f"digest     {record['digest']}",
        f"name       {record['name']}",
        f"format     {record['format']}, {human_size(record['size'])} ({record['size']} bytes)",
        f"samples    {record['samples']}",
        *arrays,
        f"pushed by  {record['pushed_by']} at {record['created_at']}",
        stored.runs_line(record, width=11),
    ]


stored.add_archive_commands(dataset_app, kind="datasets", noun="dataset")


def register(app: typer.Typer) -> None:
    """Add this module's commands to the application."""
    app.add_typer(dataset_app, name="dataset")
