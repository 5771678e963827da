"""Local commands: validate specs, run jobs in fresh processes, verify reruns bit for bit."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Annotated, Any

import typer

from service.cli.output import JsonFlag, TrainingBar, emit_json, err
from worker.errors import SpecError
from worker.node.executors.process import run_process_job
from worker.result import JobResult
from worker.spec import load_spec
from worker.verdict import build_report, describe, record_from_result

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def validate(spec: Path, as_json: JsonFlag = False) -> None:
    """Check a spec (fields and component names) and print its hash."""
    from worker.registry import check_spec

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
    if as_json:
        emit_json({"valid": True, "spec_hash": parsed.spec_hash()})
    else:
        typer.echo(f"valid  {parsed.spec_hash()}")


def _run_with_progress(
    spec: Path,
    out: Path,
    label: str,
    *,
    quiet: bool,
    checkpoint_dir: Path | None = None,
    resume: bool = False,
) -> tuple[int, JobResult]:
    with TrainingBar(label, quiet=quiet, initial="starting (TensorFlow import)") as bar:

        def on_event(event: dict[str, Any]) -> None:
            names = {"started": "training", "finished": event.get("status")}
            bar.show(event, otherwise=names.get(event["event"]))

        return run_process_job(
            spec, out, checkpoint_dir=checkpoint_dir, resume=resume, on_event=on_event
        )


def run(
    spec: Path,
    out: Annotated[Path, typer.Option(help="result document to write")] = Path("result.json"),
    checkpoint_dir: Annotated[Path | None, typer.Option(help="keep epoch checkpoints here")] = None,
    resume: Annotated[bool, typer.Option(help="continue from the newest checkpoint")] = False,
    as_json: JsonFlag = False,
) -> None:
    """Train one experiment in a fresh process and write its result document."""
    code, result = _run_with_progress(
        spec, out, "run", quiet=as_json, checkpoint_dir=checkpoint_dir, resume=resume
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
        typer.echo(f"verdict     {describe(report)}")
    raise typer.Exit(0 if report["verdict"] == "identical" else 1)


def register(app: typer.Typer) -> None:
    """Add this module's commands to the application."""
    app.command()(validate)
    app.command()(run)
    app.command(name="verify")(verify)
