"""`repro dataset push | list | show`: datasets stored by digest on the API."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from service.cli.output import (
    DEFAULT_API,
    ApiOption,
    Command,
    Group,
    JsonFlag,
    TokenOption,
    api_client,
    api_error_exit,
    emit_json,
    err,
    print_table,
)

dataset_app = typer.Typer(
    cls=Group,
    help="Push datasets (.npz of named arrays) and find them by digest.",
    no_args_is_help=True,
)


def _arrays(record: dict[str, object]) -> str:
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
    as_json: JsonFlag = False,
) -> None:
    """Upload a dataset (streamed, with its SHA-256) and print its digest for `dataset.data`."""
    from worker.node.api_errors import ApiError

    try:
        record = api_client(api, token).push_dataset(file, name=name or file.name)
    except ApiError as exc:
        raise api_error_exit(exc) from None
    if as_json:
        emit_json(record)
        return
    err.print(
        f"{record['name']}: {record['samples']} samples; {_arrays(record)}",
        markup=False,
        highlight=False,
    )
    typer.echo(record["digest"])


@dataset_app.command("list", cls=Command)
def list_(
    limit: Annotated[int, typer.Option(min=1, max=500)] = 50,
    api: ApiOption = DEFAULT_API,
    token: TokenOption = None,
    as_json: JsonFlag = False,
) -> None:
    """Datasets stored on the API, newest first.

    Digests are printed whole, unless stdout is a terminal too narrow for them: then as
    prefixes unique among those listed.
    """
    from rich.table import Table

    from worker.node.api_errors import ApiError

    try:
        page = api_client(api, token).datasets(limit=limit)
    except ApiError as exc:
        raise api_error_exit(exc) from None
    if as_json:
        emit_json(page)
        return

    def make(digests: list[str]) -> Table:
        table = Table("digest", "name", "samples", "size", "arrays", "pushed by", "when")
        for d, digest in zip(page["items"], digests, strict=True):
            table.add_row(
                digest,
                d["name"],
                str(d["samples"]),
                str(d["size"]),
                _arrays(d),
                d["pushed_by"],
                d["created_at"],
            )
        return table

    # "sha256:" and 12 hex digits at least, as `docker images` shows image IDs.
    print_table(make, [d["digest"] for d in page["items"]], shortest=19)


@dataset_app.command("show", cls=Command)
def show(
    digest: Annotated[str, typer.Argument(help="sha256:<hex> (or the bare hex)")],
    api: ApiOption = DEFAULT_API,
    token: TokenOption = None,
    as_json: JsonFlag = False,
) -> None:
    """One dataset: its arrays with shapes and dtypes, who pushed it, which runs used it."""
    from worker.node.api_errors import ApiError

    try:
        record = api_client(api, token).dataset(digest)
    except ApiError as exc:
        raise api_error_exit(exc) from None
    if as_json:
        emit_json(record)
        return
    typer.echo(f"digest     {record['digest']}")
    typer.echo(f"name       {record['name']}")
    typer.echo(f"format     {record['format']}, {record['size']} bytes")
    typer.echo(f"samples    {record['samples']}")
    for a in record["arrays"]:
        typer.echo(f"array      {a['name']}: {a['dtype']} {tuple(a['shape'])}")
    typer.echo(f"pushed by  {record['pushed_by']} at {record['created_at']}")
    runs = ", ".join(str(r) for r in record["runs"]) or "none"
    more = record["runs_total"] - len(record["runs"])
    typer.echo(f"runs       {runs}" + (f" (and {more} more)" if more > 0 else ""))


def register(app: typer.Typer) -> None:
    """Add this module's commands to the application."""
    app.add_typer(dataset_app, name="dataset")
