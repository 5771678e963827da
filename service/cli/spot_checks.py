"""`repro spot-check`: prove a run by replaying a few of its segments bit for bit."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any

import typer

from service.cli.output import (
    DEFAULT_API,
    ApiOption,
    Command,
    JsonFlag,
    TokenFileOption,
    TokenOption,
    api_error_exit,
    emit_json,
    err,
    out,
    repro_client,
)

if TYPE_CHECKING:
    from reprotrain import SpotCheck


def spot_check(
    run_id: int,
    segments: Annotated[int, typer.Option(help="segments to replay, chosen at random")] = 3,
    seed: Annotated[
        int | None, typer.Option(help="the seed that picks them (to repeat a choice)")
    ] = None,
    wait: Annotated[bool, typer.Option("--wait", help="wait for the outcome")] = False,
    timeout: Annotated[float | None, typer.Option(help="give up waiting after seconds")] = None,
    api: ApiOption = DEFAULT_API,
    token: TokenOption = None,
    token_file: TokenFileOption = None,
    as_json: JsonFlag = False,
) -> None:
    """Replay random segments of a succeeded run from its checkpoints, on other workers where
    there are; with --wait, exit 0 when every one ended bit for bit on the run's checkpoint."""
    from reprotrain import ApiError, WaitTimeout

    client = repro_client(api, token, token_file)
    try:
        check = client.spot_check(run_id, segments=segments, seed=seed)
        if not wait:
            if as_json:
                emit_json(check.raw)
            else:
                print(f"spot check {check.id} of run {run_id} queued: {_chosen(check.raw)}")
            return
        err.print(f"spot check {check.id} of run {run_id}: replaying {_chosen(check.raw)}")
        check = client.wait_spot_check(check.id, timeout=timeout)
    except ApiError as exc:
        raise api_error_exit(exc) from None
    except WaitTimeout as exc:
        err.print(str(exc))
        raise typer.Exit(1) from None
    if as_json:
        emit_json(check.raw)
    else:
        _show(check)
    raise typer.Exit(0 if check.status == "verified" else 1)


def _chosen(doc: dict[str, Any]) -> str:
    return ", ".join(f"epochs {s['from_epoch']}->{s['to_epoch']}" for s in doc["segments"])


def _show(check: SpotCheck) -> None:
    report = check.report or {}
    from rich.table import Table

    table = Table("segment", "epochs", "worker", "vs trainer", "result")
    for row in report.get("segments", []):
        table.add_row(
            str(row["index"]),
            f"{row['from_epoch']}->{row['to_epoch']}",
            str(row.get("worker") or "-"),
            "same" if row.get("same_worker") else "other",
            str(row.get("verdict") or row.get("status")),
        )
    out.print(table)
    cost = report.get("cost") or {}
    if cost.get("share") is not None:
        training = cost.get("training_share")
        print(
            f"cost: {cost['share']:.0%} of the run's time"
            + (f", {training:.0%} of its training time" if training is not None else "")
        )
    print(f"{check.status}: {report.get('explanation', '')}")


def register(app: typer.Typer) -> None:
    """Add this module's commands to the application."""
    app.command("spot-check", cls=Command)(spot_check)
