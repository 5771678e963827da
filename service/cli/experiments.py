"""`repro experiment archive | delete`: an experiment with all its runs at once."""

from __future__ import annotations

from typing import Annotated

import typer

from service.cli.by_digest import UndoFlag, YesFlag
from service.cli.output import (
    DEFAULT_API,
    ApiOption,
    Command,
    Group,
    TokenFileOption,
    TokenOption,
    delete_each,
    each,
    repro_client,
)

experiment_app = typer.Typer(
    cls=Group, help="Archive or delete experiments with their runs.", no_args_is_help=True
)
IdsArgument = Annotated[list[int], typer.Argument(help="experiment ids")]


@experiment_app.command("archive", cls=Command)
def archive(
    experiment_ids: IdsArgument,
    undo: UndoFlag = False,
    api: ApiOption = DEFAULT_API,
    token: TokenOption = None,
    token_file: TokenFileOption = None,
) -> None:
    """Archive experiments with their runs (refused while one of them has not ended); with
    --undo, bring them back with the runs archived with them. Their runs' files go after the
    retention (`repro collect`). Exit 1 if any was refused."""
    client = repro_client(api, token, token_file)

    def act(experiment_id: int) -> str:
        found = client.archive_experiment(experiment_id, archived=not undo)
        return f"experiment {found.id} {'archived' if found.archived_at else 'not archived'}"

    each(experiment_ids, act, what="experiment")


@experiment_app.command("delete", cls=Command)
def delete(
    experiment_ids: IdsArgument,
    yes: YesFlag = False,
    api: ApiOption = DEFAULT_API,
    token: TokenOption = None,
    token_file: TokenFileOption = None,
) -> None:
    """Delete experiments for good (admins); refused while one has runs (`repro delete`
    them first). Exit 1 if any was refused."""
    client = repro_client(api, token, token_file)
    delete_each(experiment_ids, client.delete_experiment, what="experiment", yes=yes)


def register(app: typer.Typer) -> None:
    """Add this module's commands to the application."""
    app.add_typer(experiment_app, name="experiment")
