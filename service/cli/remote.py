"""Commands that talk to a running API: submit, rerun, status, compare."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from service.cli.local import verdict as file_verdict
from service.cli.output import (
    DEFAULT_API,
    ApiOption,
    JsonFlag,
    TokenOption,
    TrainingBar,
    api_client,
    api_error_exit,
    emit_json,
    err,
)
from service.client import ApiClient, ApiError
from worker.result import read_result
from worker.verdict import compare_records, describe

WaitFlag = Annotated[bool, typer.Option("--wait", help="wait until the run finishes")]
TimeoutOption = Annotated[float | None, typer.Option(help="give up waiting after seconds")]


def _wait(client: ApiClient, run_id: int, *, quiet: bool, timeout: float | None) -> dict[str, Any]:
    with TrainingBar(f"run {run_id}", quiet=quiet, initial="queued") as bar:

        def on_update(run: dict[str, Any]) -> None:
            bar.show(run.get("progress"), otherwise=f"{run['status']} (attempt {run['attempt']})")

        return client.wait(run_id, timeout=timeout, on_update=on_update)


def _queued(
    client: ApiClient,
    run_id: int,
    doc: dict[str, Any],
    line: str,
    *,
    wait: bool,
    as_json: bool,
    timeout: float | None,
) -> None:
    """Print what was queued, or wait for it and exit with the run's outcome."""
    if not wait:
        if as_json:
            emit_json(doc)
        else:
            typer.echo(line)
        return
    if not as_json:
        typer.echo(line)
    raise typer.Exit(
        _finished(client, _wait(client, run_id, quiet=as_json, timeout=timeout), as_json)
    )


def _finished(client: ApiClient, run: dict[str, Any], as_json: bool) -> int:
    detail = client.run(run["id"])
    if as_json:
        emit_json(
            {
                k: detail[k]
                for k in (
                    "id",
                    "status",
                    "final_fingerprint",
                    "verdict",
                    "verdict_report",
                    "error",
                    "attempt",
                )
            }
        )
    elif detail["status"] == "succeeded":
        typer.echo(f"run {detail['id']} succeeded  {detail['final_fingerprint']}")
        if detail.get("verdict_report"):
            typer.echo(
                f"verdict vs run {detail['reference_run_id']}: {describe(detail['verdict_report'])}"
            )
    else:
        typer.echo(
            f"run {detail['id']} {detail['status']}: {(detail['error'] or {}).get('message')}"
        )
    if detail["status"] != "succeeded":
        return 1
    return 0 if detail.get("verdict") in (None, "identical") else 1


def submit(
    spec: Path,
    wait: WaitFlag = False,
    api: ApiOption = DEFAULT_API,
    token: TokenOption = None,
    timeout: TimeoutOption = None,
    as_json: JsonFlag = False,
) -> None:
    """Submit an experiment spec (YAML or JSON) and print its run id."""
    text = spec.read_text()
    content_type = "application/json" if spec.suffix.lower() == ".json" else "application/yaml"
    client = api_client(api, token)
    try:
        # A retried submission (lost response) must not create a second experiment.
        out = client.submit(text, content_type=content_type, idempotency_key=uuid.uuid4().hex)
    except ApiError as exc:
        raise api_error_exit(exc) from None
    run, experiment = out["run"], out["experiment"]
    line = (
        f"experiment {experiment['id']}  run {run['id']}  seed {experiment['seed']}  "
        f"{experiment['spec_hash']}"
    )
    _queued(client, run["id"], out, line, wait=wait, as_json=as_json, timeout=timeout)


def rerun(
    run_id: int,
    wait: WaitFlag = False,
    api: ApiOption = DEFAULT_API,
    token: TokenOption = None,
    timeout: TimeoutOption = None,
    as_json: JsonFlag = False,
) -> None:
    """Rerun a run by id; with --wait, print the verdict (exit 1 unless identical)."""
    client = api_client(api, token)
    try:
        new = client.rerun(run_id)
    except ApiError as exc:
        raise api_error_exit(exc) from None
    line = f"run {new['id']} queued (rerun of {run_id})"
    _queued(client, new["id"], new, line, wait=wait, as_json=as_json, timeout=timeout)


def status(
    run_id: Annotated[
        int | None, typer.Argument(help="one run; all recent runs if omitted")
    ] = None,
    api: ApiOption = DEFAULT_API,
    token: TokenOption = None,
    limit: int = 20,
    as_json: JsonFlag = False,
) -> None:
    """Show one run, or a table of recent runs."""
    client = api_client(api, token)
    try:
        if run_id is not None:
            detail = client.run(run_id)
            if as_json:
                emit_json(detail)
                return
            for key in (
                "id",
                "experiment_id",
                "status",
                "attempt",
                "worker_id",
                "seed",
                "spec_hash",
                "final_fingerprint",
                "verdict",
                "rerun_of_id",
                "created_at",
                "finished_at",
            ):
                typer.echo(f"{key:18} {detail.get(key)}")
            if detail.get("verdict_report"):
                typer.echo(f"{'report':18} {describe(detail['verdict_report'])}")
            return
        page = client.runs(limit=limit)
    except ApiError as exc:
        raise api_error_exit(exc) from None
    if as_json:
        emit_json(page)
        return
    table = Table("run", "experiment", "status", "attempt", "verdict", "fingerprint")
    for r in page["items"]:
        table.add_row(
            str(r["id"]),
            str(r["experiment_id"]),
            r["status"],
            str(r["attempt"]),
            r["verdict"] or ("reference" if r["is_reference"] else ""),
            (r["final_fingerprint"] or "")[:23],
        )
    err.print(table)
    err.print(f"{len(page['items'])} of {page['total']} runs")


def compare(
    a: Annotated[str, typer.Argument(help="run id or result document")],
    b: Annotated[str, typer.Argument(help="run id or result document")],
    api: ApiOption = DEFAULT_API,
    token: TokenOption = None,
    as_json: JsonFlag = False,
) -> None:
    """Compare two runs (ids) or two result documents (files); exit 0 only if identical."""
    if Path(a).is_file() and Path(b).is_file():
        report = file_verdict(read_result(Path(a)), read_result(Path(b)))
    else:
        client = api_client(api, token)
        try:
            ra, rb = client.run(int(a)), client.run(int(b))
        except (ApiError, ValueError) as exc:
            if isinstance(exc, ApiError):
                raise api_error_exit(exc) from None
            err.print(f"[red]not a run id or a result file:[/red] {exc}")
            raise typer.Exit(2) from None
        report = compare_records(
            succeeded=(ra["status"] == "succeeded", rb["status"] == "succeeded"),
            spec_hashes=(ra["spec_hash"], rb["spec_hash"]),
            trace_a=ra["trace"],
            trace_b=rb["trace"],
            final_a=ra["final_fingerprint"],
            final_b=rb["final_fingerprint"],
            data_a={d["epoch"]: d["fingerprint"] for d in ra["data_fingerprints"] or []},
            data_b={d["epoch"]: d["fingerprint"] for d in rb["data_fingerprints"] or []},
        )
    if as_json:
        emit_json(report)
    else:
        typer.echo(describe(report))
    raise typer.Exit(0 if report["verdict"] == "identical" else 1)


def register(app: typer.Typer) -> None:
    """Add this module's commands to the application."""
    for command in (submit, rerun, status, compare):
        app.command()(command)
