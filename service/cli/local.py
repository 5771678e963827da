"""Local commands: validate specs, run jobs in fresh processes, verify reruns bit for bit."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from service.cli.output import JsonFlag, TrainingBar, emit_json, err
from worker.errors import SpecError
from worker.spec import ExperimentSpec, load_spec

if TYPE_CHECKING:  # imported where used: every `repro` command starts without NumPy
    from worker.result import JobResult

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def validate(spec: Path, as_json: JsonFlag = False) -> None:
    """Check a spec (fields and component names) and print its hash."""
    from worker.models.registry import check_spec

    try:
        parsed = load_spec(spec)
        check_spec(parsed)
    except (SpecError, OSError) as exc:
        errors = getattr(exc, "errors", [])
        if as_json:
            emit_json({"valid": False, "error": str(exc), "errors": errors})
        else:
            err.print(f"[red]invalid:[/red] {exc}")
        raise typer.Exit(2) from None
    warnings = spec_warnings(parsed)
    if as_json:
        emit_json({"valid": True, "spec_hash": parsed.spec_hash(), "warnings": warnings})
    else:
        typer.echo(f"valid  {parsed.spec_hash()}")
        for warning in warnings:
            err.print(f"[yellow]warning:[/yellow] {warning}")


XLA_CHANGES_DATA = (
    "dataset.xla is true: XLA compiles the generator into other code, and TensorFlow's "
    "stateless random ops then produce other numbers, so every batch differs from the same "
    "spec without XLA (not by rounding). The spec hash keeps the two apart; comparing a run "
    "with XLA to one without reports that their data differ."
)


def spec_warnings(spec: ExperimentSpec) -> list[str]:
    """What a valid spec does that its author may not expect."""
    return [XLA_CHANGES_DATA] if spec.dataset.xla else []


def _run_with_progress(
    spec: Path,
    out: Path,
    label: str,
    *,
    quiet: bool,
    checkpoint_dir: Path | None = None,
    resume: bool = False,
    dataset_file: Path | None = None,
    export_model: Path | None = None,
) -> tuple[int, JobResult]:
    from worker.node.executors.process import run_process_job

    with TrainingBar(label, quiet=quiet, initial="starting (TensorFlow import)") as bar:

        def on_event(event: dict[str, Any]) -> None:
            names = {"started": "training", "finished": event.get("status")}
            bar.show(event, otherwise=names.get(event["event"]))

        return run_process_job(
            spec,
            out,
            checkpoint_dir=checkpoint_dir,
            resume=resume,
            on_event=on_event,
            dataset_file=dataset_file,
            export_model=export_model,
        )


def run(
    spec: Path,
    out: Annotated[Path, typer.Option(help="result document to write")] = Path("result.json"),
    checkpoint_dir: Annotated[Path | None, typer.Option(help="keep epoch checkpoints here")] = None,
    resume: Annotated[bool, typer.Option(help="continue from the newest checkpoint")] = False,
    dataset: Annotated[
        Path | None, typer.Option(help="the dataset file the spec names in dataset.data")
    ] = None,
    export_model: Annotated[
        Path | None, typer.Option(help="on success, save the final model here (.keras)")
    ] = None,
    as_json: JsonFlag = False,
) -> None:
    """Train one experiment in a fresh process and write its result document."""
    code, result = _run_with_progress(
        spec,
        out,
        "run",
        quiet=as_json,
        checkpoint_dir=checkpoint_dir,
        resume=resume,
        dataset_file=dataset,
        export_model=export_model,
    )
    if as_json:
        emit_json(result.model_dump(mode="json", exclude={"provenance", "trace"}))
    elif result.status == "succeeded":
        typer.echo(f"succeeded  {result.final_fingerprint}  (result: {out})")
    else:
        message = result.error.message if result.error else result.status
        err.print(f"[red]{result.status}:[/red] {message}")
    raise typer.Exit(code)


def verdict(
    a: JobResult, b: JobResult, labels: tuple[str, str] = ("run", "rerun")
) -> dict[str, Any]:
    """The comparison report of two result documents (incomparable if one failed)."""
    from worker.compare.verdict import build_report, record_from_result

    return build_report(record_from_result(a, labels[0]), record_from_result(b, labels[1]))


def verify(
    spec: Annotated[Path | None, typer.Argument(help="spec to run twice")] = None,
    workdir: Annotated[Path | None, typer.Option(help="keep results here")] = None,
    as_json: JsonFlag = False,
) -> None:
    """Run an experiment and its rerun, each in a fresh process, and give the verdict.

    Without SPEC, runs the bundled seed-001 example. Exit 0 when identical.
    """
    spec = spec or EXAMPLES / "seed001.yaml"
    if not spec.exists():
        err.print(f"[red]no such spec:[/red] {spec}")
        raise typer.Exit(2)
    workdir = workdir or Path(tempfile.mkdtemp(prefix="repro-verify-"))
    workdir.mkdir(parents=True, exist_ok=True)
    first_code, first = _run_with_progress(spec, workdir / "run.json", "run  ", quiet=as_json)
    if first.status != "succeeded":
        message = first.error.message if first.error else first.status
        err.print(f"[red]run failed:[/red] {message}")
        raise typer.Exit(first_code or 1)
    # The rerun pins the seed the first run resolved, as a rerun by id does.
    pinned = workdir / "rerun-spec.json"
    pinned.write_text(json.dumps(first.spec))
    _, rerun = _run_with_progress(pinned, workdir / "rerun.json", "rerun", quiet=as_json)
    report = verdict(first, rerun)
    if as_json:
        emit_json(
            {**report, "run": str(workdir / "run.json"), "rerun": str(workdir / "rerun.json")}
        )
    else:
        typer.echo(
            f"experiment  {first.spec['name'] if first.spec else spec}  "
            f"seed {first.seed}  spec {first.spec_hash}"
        )
        typer.echo(f"run         {first.final_fingerprint}")
        typer.echo(f"rerun       {rerun.final_fingerprint}")
        from worker.compare.verdict import describe

        typer.echo(f"verdict     {describe(report)}")
    raise typer.Exit(0 if report["verdict"] == "identical" else 1)


def register(app: typer.Typer) -> None:
    """Add this module's commands to the application."""
    app.command()(validate)
    app.command()(run)
    app.command(name="verify")(verify)
