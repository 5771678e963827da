"""Commands that talk to a running API: submit, rerun, status, compare."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from service.cli.output import (
    DEFAULT_API,
    ApiOption,
    Archived,
    ArchivedOption,
    Command,
    JsonFlag,
    TokenFileOption,
    TokenOption,
    TrainingBar,
    api_error_exit,
    delete_each,
    each,
    emit_json,
    err,
    metrics_line,
    print_table,
    repro_client,
    resolve_token,
)

if TYPE_CHECKING:  # imported where used: `repro --help` should not wait for an HTTP client
    from reprotrain import Client, Run

WaitFlag = Annotated[bool, typer.Option("--wait", help="wait until the run finishes")]
PriorityOption = Annotated[
    int,
    typer.Option(
        min=-1000,
        max=1000,
        help="claims take higher priorities first, before fairness across submitters "
        "(admin tokens only)",
    ),
]
TimeoutOption = Annotated[float | None, typer.Option(help="give up waiting after seconds")]
_PAGE = 500  # runs per request when listing (the server's largest page)
RunLimitOption = Annotated[
    int, typer.Option(min=0, help="runs to list, newest first; 0: every run")
]


def _wait(client: Client, run_id: int, *, quiet: bool, timeout: float | None) -> Run:
    # A script's epochs are the script's to decide: its bar counts what it reports.
    known = ((client.run(run_id).spec or {}).get("training") or {}).get("epochs")
    epochs = int(known) if known else None
    with TrainingBar(f"run {run_id}", quiet=quiet, initial="queued", total=epochs) as bar:

        def on_progress(run: Run) -> None:
            where = f"{run.status} (attempt {run.attempt})"
            if run.status == "queued" and run.waiting_reason:
                where = f"queued: {run.waiting_reason}"
            progress = run.progress.model_dump() if run.progress is not None else None
            if epochs is None:
                bar.show(progress, otherwise=where)
                return
            if run.status == "succeeded":
                # Every epoch is done, whichever event the worker reported last.
                progress = {"event": "epoch_end", "epoch": epochs}
            bar.show_epochs(progress, epochs, otherwise=where)

        return client.wait(run_id, timeout=timeout, on_progress=on_progress)


def _queued(
    client: Client,
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
    from reprotrain import ApiError, WaitTimeout

    if not as_json:
        typer.echo(line)
    try:
        code = _finished(client, _wait(client, run_id, quiet=as_json, timeout=timeout), as_json)
    except ApiError as exc:
        raise api_error_exit(exc) from None
    except WaitTimeout as exc:
        err.print(f"[red]gave up waiting:[/red] {exc}", highlight=False)
        raise typer.Exit(1) from None
    raise typer.Exit(code)


def _finished(client: Client, run: Run, as_json: bool) -> int:
    from worker.compare.verdict import describe

    detail = client.run(run.id).raw
    rows = detail.get("metrics") or []
    final: dict[str, Any] | None = rows[-1] if rows and isinstance(rows[-1], dict) else None
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
            | {"final_metrics": final}
        )
    elif detail["status"] == "succeeded":
        typer.echo(f"run {detail['id']} succeeded  {detail['final_fingerprint']}")
        if final:
            typer.echo(f"epoch {final.get('epoch')}  {metrics_line(final)}")
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
    copies: Annotated[
        int,
        typer.Option(
            min=1, max=16, help="run N copies at once on different workers and check they agree"
        ),
    ] = 1,
    priority: PriorityOption = 0,
    api: ApiOption = DEFAULT_API,
    token: TokenOption = None,
    token_file: TokenFileOption = None,
    timeout: TimeoutOption = None,
    as_json: JsonFlag = False,
) -> None:
    """Submit an experiment spec (YAML or JSON) and print its run id."""
    from reprotrain import ApiError, SpecFileError

    client = repro_client(api, token, token_file)
    try:
        # Read here, so a malformed file is named; each submit carries an idempotency key,
        # so a retried one (lost answer) creates no second experiment.
        run = client.submit(spec, copies=copies if copies > 1 else None, priority=priority)
    except SpecFileError as exc:
        err.print("[red]invalid:[/red] ", end="")
        err.print(str(exc), markup=False, highlight=False)
        raise typer.Exit(2) from None
    except ApiError as exc:
        raise api_error_exit(exc) from None
    for warning in run.warnings:
        err.print("[yellow]warning:[/yellow] ", end="")
        err.print(warning, markup=False, highlight=False)
    answer = run.submit_answer or {}
    experiment = answer["experiment"]
    line = (
        f"experiment {experiment['id']}  run {run.id}  seed {experiment['seed']}  "
        f"{experiment['spec_hash']}"
    )
    if run.audit_id is not None:
        if not as_json:
            typer.echo(f"{line}\naudit {run.audit_id}: {copies} copies queued")
        elif not wait:
            emit_json(answer)
        if not wait:
            return
        try:
            code = _show_audit(client, run.audit_id, wait=True, as_json=as_json, timeout=timeout)
        except ApiError as exc:
            raise api_error_exit(exc) from None
        raise typer.Exit(code)
    _queued(client, run.id, answer, line, wait=wait, as_json=as_json, timeout=timeout)


def submit_script(
    script: Path,
    args: list[str],
    *,
    directory: Path | None,
    name: str | None,
    seed: int | None,
    image: str | None,
    wait: bool,
    timeout: float | None,
    client_options: tuple[str, str | None, Path | None],
    as_json: bool,
) -> None:
    """`repro run SCRIPT.py -- ARGS`: push the script's directory, submit it as a run."""
    from reprotrain import ApiError, ScriptDirectoryError

    client = repro_client(*client_options)
    try:
        run = client.submit_script(
            script, args, directory=directory, name=name, seed=seed, image=image
        )
    except ScriptDirectoryError as exc:
        err.print("[red]invalid:[/red] ", end="")
        err.print(str(exc), markup=False, highlight=False)
        raise typer.Exit(2) from None
    except ApiError as exc:
        raise api_error_exit(exc) from None
    answer = run.submit_answer or {}
    experiment = answer["experiment"]
    line = (
        f"experiment {experiment['id']}  run {run.id}  seed {experiment['seed']}  "
        f"{experiment['spec_hash']}  (script {experiment['spec']['script']['entry']}, "
        f"directory {experiment['spec']['code']})"
    )
    _queued(client, run.id, answer, line, wait=wait, as_json=as_json, timeout=timeout)


def rerun(
    run_id: int,
    wait: WaitFlag = False,
    priority: PriorityOption = 0,
    api: ApiOption = DEFAULT_API,
    token: TokenOption = None,
    token_file: TokenFileOption = None,
    timeout: TimeoutOption = None,
    as_json: JsonFlag = False,
    on_worker: Annotated[
        bool,
        typer.Option(
            "--on-worker",
            help="retrain a run recorded by hand (`python train.py` with the service "
            "configured) on a worker; the comparison names what differs in the environment",
        ),
    ] = False,
    hardware: Annotated[
        str | None,
        typer.Option(
            help="run on this hardware class (or leading part, e.g. gpu), or any, instead "
            "of the class the run trained on; the comparison reports the change",
        ),
    ] = None,
) -> None:
    """Rerun a run by id, on the hardware class it trained on; with --wait, print the
    verdict (exit 1 unless identical)."""
    from reprotrain import ApiError

    client = repro_client(api, token, token_file)
    try:
        new = client.rerun(run_id, priority=priority, on_worker=on_worker, hardware=hardware)
    except ApiError as exc:
        raise api_error_exit(exc) from None
    line = f"run {new.id} queued (rerun of {run_id}"
    line += f", on {new.raw['required_hardware']})" if new.raw.get("required_hardware") else ")"
    _queued(client, new.id, new.raw, line, wait=wait, as_json=as_json, timeout=timeout)


def status(
    run_id: Annotated[
        int | None, typer.Argument(help="one run; all recent runs if omitted")
    ] = None,
    api: ApiOption = DEFAULT_API,
    token: TokenOption = None,
    token_file: TokenFileOption = None,
    limit: RunLimitOption = 20,
    as_json: JsonFlag = False,
) -> None:
    """Show one run, or a table of recent runs (read a page at a time, by cursor)."""
    from reprotrain import ApiError
    from worker.compare.verdict import describe

    client = repro_client(api, token, token_file)
    try:
        if run_id is not None:
            detail = client.run(run_id).raw
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
            if detail.get("waiting_reason"):
                typer.echo(f"{'waiting':18} {detail['waiting_reason']}")
            for key in ("name", "tags", "notes"):
                if detail.get(key):
                    shown = ", ".join(detail[key]) if key == "tags" else detail[key]
                    typer.echo(f"{key:18} {shown}")
            if detail.get("verdict_report"):
                typer.echo(f"{'report':18} {describe(detail['verdict_report'])}")
            return
        page = _runs(client, limit)
    except ApiError as exc:
        raise api_error_exit(exc) from None
    _print_runs(page, as_json=as_json)


def runs(
    status: Annotated[
        str | None, typer.Option(help="queued, running, succeeded, failed or cancelled")
    ] = None,
    experiment: Annotated[int | None, typer.Option(help="one experiment's runs")] = None,
    verdict: Annotated[
        str | None, typer.Option(help="identical, diverged, incomparable or pending")
    ] = None,
    tag: Annotated[str | None, typer.Option(help="runs with this tag")] = None,
    search: Annotated[
        str | None,
        typer.Option(
            "--search",
            "-s",
            help="e.g. 'params.training.epochs = 4 and metrics.accuracy > 0.9' (README: "
            "Searching runs)",
        ),
    ] = None,
    archived: ArchivedOption = Archived.false,
    api: ApiOption = DEFAULT_API,
    token: TokenOption = None,
    token_file: TokenFileOption = None,
    limit: RunLimitOption = 20,
    as_json: JsonFlag = False,
) -> None:
    """List runs, newest first, filtered by status, experiment, verdict, tag or a search."""
    from reprotrain import ApiError

    client = repro_client(api, token, token_file)
    filters = {
        "status": status,
        "experiment_id": experiment,
        "verdict": verdict,
        "tag": tag,
        "search": search,
        "archived": archived.value,
    }
    try:
        page = _runs(client, limit, **filters)
    except ApiError as exc:
        raise api_error_exit(exc) from None
    _print_runs(page, as_json=as_json)


def _print_runs(page: dict[str, Any], *, as_json: bool) -> None:
    if as_json:
        emit_json(page)
        return
    from rich.table import Table

    def make(fingerprints: list[str]) -> Table:
        table = Table("run", "experiment", "status", "attempt", "verdict", "fingerprint", "name")
        for r, fingerprint in zip(page["items"], fingerprints, strict=True):
            table.add_row(
                str(r["id"]),
                str(r["experiment_id"]),
                r["status"],
                str(r["attempt"]),
                r["verdict"] or ("reference" if r["is_reference"] else ""),
                fingerprint,
                _label(r),
            )
        return table

    fingerprints = [r["final_fingerprint"] or "" for r in page["items"]]
    print_table(make, fingerprints, column=5, shortest=23)
    more = " (more: raise --limit, or --limit 0 for all)" if page["next_cursor"] else ""
    err.print(f"{len(page['items'])} runs{more}", highlight=False)


def _runs(client: Client, limit: int, **filters: Any) -> dict[str, Any]:
    """Up to `limit` runs (0: all), newest first, following the server's page cursors:
    {"items": [...], "next_cursor": where to go on, or None}."""
    items: list[dict[str, Any]] = []
    cursor: str | None = None
    while True:
        want = _PAGE if limit == 0 else min(_PAGE, limit - len(items))
        page = client.runs_page(limit=want, cursor=cursor, **filters)
        items += [run.raw for run in page.items]
        cursor = page.next_cursor
        if cursor is None or (limit and len(items) >= limit):
            return {"items": items, "next_cursor": cursor}


def _wait_refinement(
    client: Client, refinement: dict[str, Any], *, quiet: bool, timeout: float | None
) -> dict[str, Any]:
    deadline = None if timeout is None else time.monotonic() + timeout
    shown: str | None = None
    while refinement["status"] in ("queued", "running"):
        line = "; ".join(
            f"run {r['id']} {r['status']}"
            + (f" (epoch {r['progress'].get('epoch')})" if r.get("progress") else "")
            for r in refinement["runs"]
        )
        line += "".join(f"; {w}" for w in refinement["waiting"])
        if not quiet and line != shown:
            err.print(f"refinement {refinement['id']}: {line}")
            shown = line
        if deadline is not None and time.monotonic() > deadline:
            raise TimeoutError(f"refinement {refinement['id']} unfinished after {timeout} s")
        time.sleep(1.0)
        refinement = client.refinement(refinement["id"]).raw
    return refinement


def compare(
    runs: Annotated[
        list[str],
        typer.Argument(
            help="two run ids or result documents, or three or more run ids",
            metavar="RUN",
            show_default=False,
        ),
    ],
    refine: Annotated[
        bool,
        typer.Option(
            "--refine",
            help="re-run the divergent epoch step by step on each run's worker to find the step",
        ),
    ] = False,
    api: ApiOption = DEFAULT_API,
    token: TokenOption = None,
    token_file: TokenFileOption = None,
    timeout: TimeoutOption = None,
    as_json: JsonFlag = False,
) -> None:
    """Compare two runs (ids) or two result documents (files), or three or more runs at once;
    exit 0 only if every pair is identical.

    Two: where the runs first diverge, which variables differ and by how much, whether the
    data or the computation diverged, and which environment fields differ. Three or more:
    each pair's verdict as a matrix, and the spec and environment fields that differ.
    """
    # Imported here: the report code needs NumPy, which no other command should wait for.
    from reprotrain import ApiError
    from service.cli.local import verdict as file_verdict
    from service.cli.report import print_report
    from worker.result import read_result

    if len(runs) != 2:
        token = resolve_token(token, token_file)
        raise typer.Exit(_compare_many(runs, refine=refine, api=api, token=token, json=as_json))
    a, b = runs
    if Path(a).is_file() and Path(b).is_file():
        if refine:
            err.print("[red]--refine needs run ids:[/red] the service re-runs each on its worker")
            raise typer.Exit(2)
        report = file_verdict(read_result(Path(a)), read_result(Path(b)), (a, b))
    else:
        try:
            ids = int(a), int(b)
        except ValueError:
            err.print(f"[red]not a run id or a result file:[/red] {a if not a.isdigit() else b}")
            raise typer.Exit(2) from None
        client = repro_client(api, token, token_file)
        try:
            report = client.compare(*ids).raw
            if refine and report["verdict"] == "diverged":
                if not as_json:
                    print_report(report)
                    typer.echo("")
                refinement = _wait_refinement(
                    client, client.refine(*ids).raw, quiet=as_json, timeout=timeout
                )
                if as_json:
                    emit_json({"comparison": report, "refinement": refinement})
                elif refinement["status"] == "failed":
                    errors = [r["error"] for r in refinement["runs"] if r.get("error")]
                    err.print(f"[red]refinement {refinement['id']} failed:[/red] {errors}")
                else:
                    typer.echo(f"refined (re-trace of epoch {refinement['epoch']}):")
                    print_report(refinement["report"])
                raise typer.Exit(0 if report["verdict"] == "identical" else 1)
        except ApiError as exc:
            raise api_error_exit(exc) from None
    if as_json:
        emit_json(report)
    else:
        print_report(report)
    raise typer.Exit(0 if report["verdict"] == "identical" else 1)


def _compare_many(runs: list[str], *, refine: bool, api: str, token: str | None, json: bool) -> int:
    """Three or more runs compared at once: 0 if every pair is identical, 1 otherwise."""
    from reprotrain import ApiError
    from service.cli.runs_matrix import print_matrix

    if len(runs) < 2:
        err.print("[red]name two runs or more to compare[/red]")
        return 2
    if refine:
        err.print("[red]--refine takes two runs:[/red] it re-runs one pair's divergent epoch")
        return 2
    bad = [r for r in runs if not (r.isascii() and r.isdigit())]
    if bad:
        err.print(f"[red]not a run id:[/red] {bad[0]} (three or more runs: ids only)")
        return 2
    try:
        found = repro_client(api, token).compare_runs([int(r) for r in runs])
    except ApiError as exc:
        raise api_error_exit(exc) from None
    if json:
        emit_json(found.raw)
    else:
        print_matrix(found)
    return 0 if found.identical else 1


def audit_copies(
    audit_id: Annotated[int, typer.Argument(help="the audit id (its first run's id)")],
    wait: WaitFlag = False,
    api: ApiOption = DEFAULT_API,
    token: TokenOption = None,
    token_file: TokenFileOption = None,
    timeout: TimeoutOption = None,
    as_json: JsonFlag = False,
) -> None:
    """Show a reproducibility audit (submit --copies N); exit 0 only if all copies agree."""
    from reprotrain import ApiError

    client = repro_client(api, token, token_file)
    try:
        raise typer.Exit(_show_audit(client, audit_id, wait=wait, as_json=as_json, timeout=timeout))
    except ApiError as exc:
        raise api_error_exit(exc) from None


def _show_audit(
    client: Client, audit_id: int, *, wait: bool, as_json: bool, timeout: float | None
) -> int:
    deadline = None if timeout is None else time.monotonic() + timeout
    shown: str | None = None
    while True:
        doc = client.audit(audit_id).raw
        if doc["finished"] or not wait:
            break
        if not as_json and doc["summary"] != shown:
            err.print(f"audit {audit_id}: {doc['summary']}")
            shown = doc["summary"]
        if deadline is not None and time.monotonic() > deadline:
            raise TimeoutError(f"audit {audit_id} unfinished after {timeout} s")
        time.sleep(1.0)
    if as_json:
        emit_json(doc)
    else:
        for copy in doc["copies"]:
            typer.echo(
                f"run {copy['id']:<6} {copy['status']:<10} worker {copy['worker'] or '-':<20} "
                f"{copy['final_fingerprint'] or ''}"
            )
        typer.echo(f"audit {audit_id}: {doc['summary']}")
    return 0 if doc["agree"] else 1


def edit(
    run_id: int,
    name: Annotated[str | None, typer.Option(help='the run\'s name ("" clears it)')] = None,
    notes: Annotated[str | None, typer.Option(help='notes on the run ("" clears them)')] = None,
    tag: Annotated[list[str] | None, typer.Option("--tag", help="add a tag (repeatable)")] = None,
    untag: Annotated[
        list[str] | None, typer.Option("--untag", help="remove a tag (repeatable)")
    ] = None,
    clear_tags: Annotated[
        bool, typer.Option("--clear-tags", help="remove every tag first")
    ] = False,
    api: ApiOption = DEFAULT_API,
    token: TokenOption = None,
    token_file: TokenFileOption = None,
    as_json: JsonFlag = False,
) -> None:
    """Name a run, write notes on it, add or remove tags; shows it in the runs list and on
    its page, and `repro runs --tag T` finds it. Recorded in the audit log."""
    from reprotrain import ApiError

    changes: dict[str, Any] = {"add_tags": tag or [], "remove_tags": untag or []}
    if name is not None:
        changes["name"] = name
    if notes is not None:
        changes["notes"] = notes
    if clear_tags:
        changes["tags"] = []
    if len(changes) == 2 and not tag and not untag:
        err.print(
            "[red]nothing to change:[/red] give --name, --notes, --tag, --untag or --clear-tags"
        )
        raise typer.Exit(2)
    client = repro_client(api, token, token_file)
    try:
        run = client.edit_run(run_id, **changes)
    except ApiError as exc:
        raise api_error_exit(exc) from None
    if as_json:
        emit_json(run.raw)
        return
    typer.echo(f"run {run.id}  {_label(run.raw) or '(no name or tags)'}")


def _label(run: dict[str, Any]) -> str:
    """A run's name and tags as one cell: `name [tag, tag]`."""
    tags = f"[{', '.join(run['tags'])}]" if run.get("tags") else ""
    return " ".join(part for part in (run.get("name") or "", tags) if part)


def archive(
    run_ids: Annotated[list[int], typer.Argument(help="the runs to archive")],
    undo: Annotated[bool, typer.Option("--undo", help="bring them back instead")] = False,
    api: ApiOption = DEFAULT_API,
    token: TokenOption = None,
    token_file: TokenFileOption = None,
) -> None:
    """Archive ended runs: lists leave them out unless asked (`repro runs --archived true`);
    nothing of them is removed. Exit 1 if any could not be archived."""
    client = repro_client(api, token, token_file)

    def act(run_id: int) -> str:
        run = client.archive_run(run_id, archived=not undo)
        return f"run {run.id} {'archived' if run.archived_at else 'not archived'}"

    each(run_ids, act, what="run")


def cancel(
    run_ids: Annotated[list[int], typer.Argument(help="the runs to cancel")],
    api: ApiOption = DEFAULT_API,
    token: TokenOption = None,
    token_file: TokenFileOption = None,
    as_json: JsonFlag = False,
) -> None:
    """Cancel queued or running runs (a running job stops at its next report); a run that
    has already ended is left as it is, saying so. Exit 1 if any could not be cancelled."""
    from reprotrain import ApiError

    client = repro_client(api, token, token_file)
    done, failed = [], 0
    for run_id in run_ids:
        try:
            run = client.cancel(run_id)
        except ApiError as exc:
            failed += 1
            err.print(f"[red]run {run_id}:[/red] {exc}", highlight=False)
            continue
        done.append(run.raw)
        if not as_json:
            typer.echo(f"run {run.id} {run.status}")
    if as_json:
        emit_json(done)
    raise typer.Exit(1 if failed else 0)


def delete(
    run_ids: Annotated[list[int], typer.Argument(help="the runs to delete")],
    yes: Annotated[bool, typer.Option("--yes", help="do not ask first")] = False,
    api: ApiOption = DEFAULT_API,
    token: TokenOption = None,
    token_file: TokenFileOption = None,
) -> None:
    """Delete ended runs for good, records and files (admins). A run something refers to
    (its reruns, verdicts against it) is refused: delete those first. To hide runs, use
    `repro archive`. Exit 1 if any could not be deleted."""
    client = repro_client(api, token, token_file)
    delete_each(run_ids, client.delete_run, what="run", yes=yes)


def logs(
    run_id: Annotated[int, typer.Argument(help="the run")],
    follow: Annotated[
        bool, typer.Option("--follow", "-f", help="keep printing new lines until the run ends")
    ] = False,
    attempt: Annotated[
        int | None, typer.Option(help="an earlier attempt's log (default: the latest)")
    ] = None,
    api: ApiOption = DEFAULT_API,
    token: TokenOption = None,
    token_file: TokenFileOption = None,
) -> None:
    """Print a run's job log (its stderr, and a script's stdout) as the worker sent it: the
    last REPRO_MAX_LOG_BYTES of each attempt, live while the run trains."""
    from reprotrain import ApiError

    client = repro_client(api, token, token_file)
    try:
        if follow and attempt is None:
            for piece in client.follow_log(run_id):
                sys.stdout.write(piece)
                sys.stdout.flush()
            return
        found = client.log(run_id, attempt=attempt)
    except ApiError as exc:
        raise api_error_exit(exc) from None
    except KeyboardInterrupt:
        raise typer.Exit(130) from None
    if found.dropped:
        err.print(f"(the first {found.dropped} bytes of this log are no longer kept)")
    if found.attempt is None:
        waits = " (it waits for a worker)" if found.running else ""
        err.print(f"run {run_id} has no log yet{waits}")
    sys.stdout.write(found.text)


def register(app: typer.Typer) -> None:
    """Add this module's commands to the application."""
    commands = (submit, rerun, status, runs, logs, edit, archive, delete, cancel, compare,
                audit_copies)  # fmt: skip
    for command in commands:
        app.command(cls=Command)(command)
