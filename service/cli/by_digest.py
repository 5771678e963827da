"""What `repro dataset`, `repro model` and `repro code` share: the API's answer or its
error, `--json`, the push's digest on stdout, the list's digest table, the runs line.

Imported by those commands at start, so the client is imported only when a call is made.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Annotated, Any

import typer

from service.cli.output import (
    DEFAULT_API,
    ApiOption,
    Command,
    TokenFileOption,
    TokenOption,
    api_error_exit,
    delete_each,
    each,
    emit_json,
    err,
    print_table,
    repro_client,
)

if TYPE_CHECKING:
    from rich.table import Table

    from reprotrain.models import ApiModel

Answer = dict[str, Any]
DigestArgument = Annotated[str, typer.Argument(help="sha256:<hex> (or the bare hex)")]
DigestsArgument = Annotated[list[str], typer.Argument(help="sha256:<hex> (or the bare hex)")]
LimitOption = Annotated[int, typer.Option(min=1, max=500)]
UndoFlag = Annotated[bool, typer.Option("--undo", help="bring them back instead")]
YesFlag = Annotated[bool, typer.Option("--yes", help="do not ask first")]


def fetched(call: Callable[[], ApiModel]) -> Answer:
    """The answer `call` gets from the API as it was sent; what the API said, and an exit,
    when it refused."""
    from reprotrain import ApiError

    try:
        answer: Answer = call().raw
    except ApiError as exc:
        raise api_error_exit(exc) from None
    return answer


def pushed(record: Answer, *, as_json: bool, summary: Callable[[Answer], str]) -> None:
    """The pushed file's record as JSON, or its summary on stderr and its digest on stdout
    (for a spec, or a script's `$(...)`)."""
    if as_json:
        emit_json(record)
        return
    err.print(summary(record), markup=False, highlight=False)
    typer.echo(record["digest"])


def listed(
    page: Answer,
    *,
    as_json: bool,
    headers: Sequence[str],
    cells: Callable[[Answer], Sequence[str]],
) -> None:
    """A page of records as JSON, or as a table: the digest, then `headers` with `cells`."""
    if as_json:
        emit_json(page)
        return
    from rich.table import Table

    def make(digests: list[str]) -> Table:
        table = Table("digest", *headers)
        for item, digest in zip(page["items"], digests, strict=True):
            table.add_row(digest, *cells(item))
        return table

    # "sha256:" and 12 hex digits at least, as `docker images` shows image IDs.
    print_table(make, [d["digest"] for d in page["items"]], column=0, shortest=19)


def shown(record: Answer, *, as_json: bool, lines: Callable[[Answer], list[str]]) -> None:
    """One record as JSON, or as the labelled `lines`."""
    if as_json:
        emit_json(record)
        return
    for line in lines(record):
        typer.echo(line)


def runs_line(record: Answer, *, width: int, more: bool = True) -> str:
    """The runs that used the file, the label padded to `width`; with `more`, how many
    runs past those listed."""
    runs = ", ".join(str(r) for r in record["runs"]) or "none"
    beyond = record["runs_total"] - len(record["runs"])
    return f"{'runs':<{width}}{runs}" + (f" (and {beyond} more)" if more and beyond > 0 else "")


def add_archive_commands(app: typer.Typer, *, kind: str, noun: str) -> None:
    """`archive [--undo]` and `delete` for the kind the client reaches as `Client.{kind}`."""

    def archive(
        digests: DigestsArgument,
        undo: UndoFlag = False,
        api: ApiOption = DEFAULT_API,
        token: TokenOption = None,
        token_file: TokenFileOption = None,
    ) -> None:
        files = getattr(repro_client(api, token, token_file), kind)

        def act(digest: str) -> str:
            record = files.archive(digest, archived=not undo)
            return f"{noun} {digest} {'archived' if record.archived_at else 'not archived'}"

        each(digests, act, what=noun)

    def delete(
        digests: DigestsArgument,
        yes: YesFlag = False,
        api: ApiOption = DEFAULT_API,
        token: TokenOption = None,
        token_file: TokenFileOption = None,
    ) -> None:
        files = getattr(repro_client(api, token, token_file), kind)
        delete_each(digests, files.delete, what=noun, yes=yes)

    archive.__doc__ = (
        f"Archive {noun}s: lists leave them out (`list --archived true` shows them), new "
        "experiments may not name them, runs that used them rerun as before. Once archived "
        "longer than the retention and no run in the lists used them, `repro collect` "
        "removes their bytes; pushing the same file restores them. Exit 1 if any was refused."
    )
    delete.__doc__ = (
        f"Delete {noun}s for good, records and bytes (admins); refused while an experiment "
        "names one. Exit 1 if any was refused."
    )
    app.command("archive", cls=Command)(archive)
    app.command("delete", cls=Command)(delete)
