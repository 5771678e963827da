"""Admin commands: tokens and the audit log (through the API, with an admin token)."""

from __future__ import annotations

from typing import Annotated

import typer

from service.cli.output import (
    DEFAULT_API,
    ApiOption,
    Command,
    Group,
    JsonFlag,
    TokenFileOption,
    TokenOption,
    api_error_exit,
    emit_json,
    err,
    human_size,
    out,
    repro_client,
)

token_app = typer.Typer(
    cls=Group, help="Create, list and revoke API tokens (admins).", no_args_is_help=True
)


@token_app.command("create", cls=Command)
def create(
    role: Annotated[str, typer.Option(help="admin, submitter, worker or viewer")],
    name: Annotated[str, typer.Option(help="who or what will use it")] = "cli",
    expires_days: Annotated[float | None, typer.Option(help="lifetime in days")] = None,
    api: ApiOption = DEFAULT_API,
    token: TokenOption = None,
    token_file: TokenFileOption = None,
    as_json: JsonFlag = False,
) -> None:
    """Create a token; its secret is printed once and never again."""
    from reprotrain import ApiError

    try:
        created = (
            repro_client(api, token, token_file)
            .tokens.create(name, role, expires_in_days=expires_days)
            .raw
        )
    except ApiError as exc:
        raise api_error_exit(exc) from None
    if as_json:
        emit_json(created)
    else:
        err.print(
            f"token {created['id']} ({created['role']}, {created['name']}); keep it secret:",
            markup=False,
            highlight=False,
        )
        typer.echo(created["token"])


@token_app.command("list", cls=Command)
def list_(
    api: ApiOption = DEFAULT_API,
    token: TokenOption = None,
    token_file: TokenFileOption = None,
    as_json: JsonFlag = False,
) -> None:
    """Every token, without secrets."""
    from rich.table import Table

    from reprotrain import ApiError

    try:
        tokens = [t.raw for t in repro_client(api, token, token_file).tokens.list()]
    except ApiError as exc:
        raise api_error_exit(exc) from None
    if as_json:
        emit_json(tokens)
        return
    table = Table("id", "name", "role", "created", "expires", "revoked", "last used")
    for t in tokens:
        table.add_row(
            str(t["id"]),
            t["name"],
            t["role"],
            t["created_at"],
            t["expires_at"] or "",
            t["revoked_at"] or "",
            t["last_used_at"] or "",
        )
    out.print(table)


@token_app.command("revoke", cls=Command)
def revoke(
    token_id: int,
    api: ApiOption = DEFAULT_API,
    token: TokenOption = None,
    token_file: TokenFileOption = None,
    as_json: JsonFlag = False,
) -> None:
    """Revoke a token at once."""
    from reprotrain import ApiError

    try:
        revoked = repro_client(api, token, token_file).tokens.revoke(token_id).raw
    except ApiError as exc:
        raise api_error_exit(exc) from None
    if as_json:
        emit_json(revoked)
    else:
        typer.echo(f"token {token_id} revoked")


def audit(
    action: Annotated[str | None, typer.Option(help="e.g. experiment.submit, run.rerun")] = None,
    limit: int = 50,
    api: ApiOption = DEFAULT_API,
    token: TokenOption = None,
    token_file: TokenFileOption = None,
    as_json: JsonFlag = False,
) -> None:
    """Who submitted, reran, cancelled or created tokens, newest first (admins)."""
    from rich.table import Table

    from reprotrain import ApiError

    try:
        page = repro_client(api, token, token_file).audit_log(action=action, limit=limit).raw
    except ApiError as exc:
        raise api_error_exit(exc) from None
    if as_json:
        emit_json(page)
        return
    table = Table("when", "who", "role", "action", "target")
    for e in page["items"]:
        table.add_row(
            e["at"],
            e["actor"],
            e["role"],
            e["action"],
            f"{e['target_type']} {e['target_id'] or ''}",
        )
    out.print(table)


def collect(
    dry_run: Annotated[bool, typer.Option("--dry-run", help="only say what would go")] = False,
    days: Annotated[
        float | None,
        typer.Option(min=0, help="the retention in days (default: the server's setting)"),
    ] = None,
    api: ApiOption = DEFAULT_API,
    token: TokenOption = None,
    token_file: TokenFileOption = None,
    as_json: JsonFlag = False,
) -> None:
    """Remove the files (checkpoints, model, job log) of runs archived longer than the
    retention, keeping their records (admins). A family's reference keeps its files while a
    rerun of it is not archived. Archived datasets, model definitions and code bundles lose
    their bytes once no run in the lists used them. Run it daily, from cron or a scheduled
    job."""
    from reprotrain import ApiError

    try:
        found = repro_client(api, token, token_file).collect_archived(
            dry_run=dry_run, retention_days=days
        )
    except ApiError as exc:
        raise api_error_exit(exc) from None
    if as_json:
        emit_json(found)
        return
    verb = "would remove" if dry_run else "removed"
    runs = ", ".join(str(r) for r in found["runs"]) or "none"
    typer.echo(
        f"{verb} {found['files']} files ({human_size(found['bytes'])}) of runs archived before "
        f"{found['cutoff']} ({found['retention_days']:g} days): {runs}"
    )
    for kept in found["kept"]:
        typer.echo(f"kept run {kept['run']}: {kept['why']}")
    for gone in found.get("stored", []):
        typer.echo(f"{verb} {gone['kind']} {gone['digest']} ({human_size(gone['bytes'])})")
    for kept in found.get("stored_kept", []):
        typer.echo(f"kept {kept['kind']} {kept['digest']}: {kept['why']}")
    if found["more"]:
        typer.echo("more runs are due: run it again")


def register(app: typer.Typer) -> None:
    """Add this module's commands to the application."""
    app.add_typer(token_app, name="token")
    app.command(cls=Command)(audit)
    app.command(cls=Command)(collect)
