"""`repro model push | list | show`: Keras model definitions stored by digest on the API."""

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

model_app = typer.Typer(
    cls=Group,
    help="Push Keras model definitions (model.to_json(), or a .keras archive) by digest.",
    no_args_is_help=True,
)


@model_app.command("push", cls=Command)
def push(
    file: Annotated[
        Path,
        typer.Argument(
            exists=True, dir_okay=False, readable=True, help="a Keras JSON config or .keras file"
        ),
    ],
    name: Annotated[str | None, typer.Option(help="a label (default: the file name)")] = None,
    api: ApiOption = DEFAULT_API,
    token: TokenOption = None,
    token_file: TokenFileOption = None,
    as_json: JsonFlag = False,
) -> None:
    """Upload a model definition and print its digest for `model.definition`.

    Only the architecture is used: weights in a .keras archive are ignored.
    """
    record = stored.fetched(
        lambda: repro_client(api, token, token_file).models.push(file, name=name or file.name)
    )
    stored.pushed(record, as_json=as_json, summary=_summary)


def _summary(record: stored.Answer) -> str:
    summary = (
        f"{record['name']}: {record['layer_count']} layers, {record['parameter_count']} parameters"
    )
    return f"{summary}; {record['note']}" if record.get("note") else summary


@model_app.command("list", cls=Command)
def list_(
    limit: stored.LimitOption = 50,
    archived: ArchivedOption = Archived.false,
    api: ApiOption = DEFAULT_API,
    token: TokenOption = None,
    token_file: TokenFileOption = None,
    as_json: JsonFlag = False,
) -> None:
    """Model definitions stored on the API, newest first."""
    page = stored.fetched(
        lambda: repro_client(api, token, token_file).models.page(
            limit=limit, archived=archived.value
        )
    )
    headers = ("name", "layers", "parameters", "format", "pushed by", "when")
    stored.listed(page, as_json=as_json, headers=headers, cells=_cells)


def _cells(d: stored.Answer) -> list[str]:
    counts = [str(d["layer_count"]), str(d["parameter_count"])]
    return [d["name"], *counts, d["format"], d["pushed_by"], d["created_at"]]


@model_app.command("show", cls=Command)
def show(
    digest: stored.DigestArgument,
    api: ApiOption = DEFAULT_API,
    token: TokenOption = None,
    token_file: TokenFileOption = None,
    as_json: JsonFlag = False,
) -> None:
    """One model definition: its layers with their parameters, who pushed it, which runs
    trained it."""
    record = stored.fetched(lambda: repro_client(api, token, token_file).models.get(digest))
    stored.shown(record, as_json=as_json, lines=_lines)


def _lines(record: stored.Answer) -> list[str]:
    layers = [
        f"layer       {layer['path']}: {layer['class_name']} ({layer['parameters']})"
        for layer in record["layers"]
    ]
    return [
        f"digest      {record['digest']}",
        f"name        {record['name']}",
        f"format      {record['format']}, {human_size(record['size'])} ({record['size']} bytes)",
        f"parameters  {record['parameter_count']} in {record['layer_count']} layers",
        *layers,
        f"pushed by   {record['pushed_by']} at {record['created_at']}",
        stored.runs_line(record, width=12),
    ]


stored.add_archive_commands(model_app, kind="models", noun="model definition")


def register(app: typer.Typer) -> None:
    """Add this module's commands to the application."""
    app.add_typer(model_app, name="model")
