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

# Exit codes: 0 only when every segment replayed bit for bit on another worker identity; a
# check the trainer's own identity took part in shows determinism, not honesty, so it is
# not reported as success; anything else that did not verify is 1 (2: a refused request).
SELF_CONSISTENT_EXIT = 3


def spot_check(
    run_id: int,
    segments: Annotated[int, typer.Option(help="segments to replay, chosen at random")] = 3,
    seed: Annotated[
        int | None, typer.Option(help="the seed that picks them (to repeat a choice)")
    ] = None,
    allow_trainer: Annotated[
        bool,
        typer.Option(
            "--allow-trainer",
            help="let the worker token that trained the run replay it (checks determinism "
            "only: the outcome is then self-consistent, exit 3, never verified)",
        ),
    ] = False,
    wait: Annotated[bool, typer.Option("--wait", help="wait for the outcome")] = False,
    timeout: Annotated[float | None, typer.Option(help="give up waiting after seconds")] = None,
    api: ApiOption = DEFAULT_API,
    token: TokenOption = None,
    token_file: TokenFileOption = None,
    as_json: JsonFlag = False,
) -> None:
    """Replay random segments of a succeeded run from its checkpoints on workers of another
    token than the one that trained it; with --wait, exit 0 when every one ended bit for bit
    on the run's checkpoint (3: so did they, but on the trainer's own token; 1 otherwise)."""
    from reprotrain import ApiError, WaitTimeout

    client = repro_client(api, token, token_file)
    try:
        check = client.spot_check(run_id, segments=segments, seed=seed, allow_trainer=allow_trainer)
        if not wait:
            if as_json:
                emit_json(check.raw)
            else:
                print(f"spot check {check.id} of run {run_id} queued: {_chosen(check.raw)}")
            return
        err.print(f"spot check {check.id} of run {run_id}: replaying {_chosen(check.raw)}")
        said: list[str] = []

        def say_why(pending: Any) -> None:
            # Once: replays that wait for another worker say so at once, not after the wait.
            if pending.waiting_reason and not said:
                said.append(pending.waiting_reason)
                err.print(f"waiting: {pending.waiting_reason}", highlight=False, markup=False)

        check = client.wait_spot_check(check.id, timeout=timeout, on_progress=say_why)
    except ApiError as exc:
        raise api_error_exit(exc) from None
    except WaitTimeout as exc:
        err.print(str(exc))
        raise typer.Exit(1) from None
    if as_json:
        emit_json(check.raw)
    else:
        _show(check)
    raise typer.Exit(_exit_code(check.status))


def _exit_code(status: str) -> int:
    if status == "verified":
        return 0
    return SELF_CONSISTENT_EXIT if status == "self-consistent" else 1


def _chosen(doc: dict[str, Any]) -> str:
    return ", ".join(f"epochs {s['from_epoch']}->{s['to_epoch']}" for s in doc["segments"])


def _show(check: SpotCheck) -> None:
    report = check.report or {}
    from rich.table import Table

    table = Table("segment", "epochs", "worker", "identity", "result")
    for row in report.get("segments", []):
        table.add_row(
            str(row["index"]),
            f"{row['from_epoch']}->{row['to_epoch']}",
            str(row.get("worker") or "-"),
            "the trainer's" if row.get("same_worker") else "another",
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
