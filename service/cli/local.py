"""Local commands: validate specs, run jobs in fresh processes, verify reruns bit for bit."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from service.cli.output import (
    DEFAULT_API,
    ApiOption,
    Command,
    JsonFlag,
    TokenFileOption,
    TokenOption,
    TrainingBar,
    emit_json,
    err,
)

if TYPE_CHECKING:  # imported where used: every `repro` command starts without NumPy or pydantic
    from worker.result import JobResult
    from worker.spec import ExperimentSpec

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def validate(
    spec: Path,
    dataset: Annotated[
        Path | None,
        typer.Option(help="the dataset file dataset.data names: check that it fits the spec"),
    ] = None,
    as_json: JsonFlag = False,
) -> None:
    """Check a spec (fields, component names, whether its data fits its model) and print
    its hash."""
    from worker.data.dataset_format import DatasetFormatError, inspect_dataset
    from worker.errors import SpecError
    from worker.models.data_fit import check_data_fit
    from worker.models.registry import check_spec
    from worker.spec import ScriptExperimentSpec, load_spec, with_suggestion

    try:
        parsed = load_spec(spec)
        if isinstance(parsed, ScriptExperimentSpec):
            raise SpecError("a script experiment is submitted with `repro run SCRIPT.py`")
        check_spec(parsed)
        # The same judgement as the server's at submit, which reads the pushed dataset's record.
        check_data_fit(parsed, inspect_dataset(dataset) if dataset is not None else None)
    except (SpecError, OSError, DatasetFormatError) as exc:
        errors = [with_suggestion(e) for e in getattr(exc, "errors", [])]
        if as_json:
            emit_json({"valid": False, "error": named(str(exc), spec), "errors": errors})
        else:
            for line in _problems(exc, errors, spec):
                err.print("[red]invalid:[/red] ", end="")
                err.print(line, markup=False, highlight=False)
        raise typer.Exit(2) from None
    warnings = spec_warnings(parsed)
    if as_json:
        emit_json({"valid": True, "spec_hash": parsed.spec_hash(), "warnings": warnings})
    else:
        typer.echo(f"valid  {parsed.spec_hash()}")
        for warning in warnings:
            err.print("[yellow]warning:[/yellow] ", end="")
            err.print(warning, markup=False, highlight=False)


def named(message: str, path: Path) -> str:
    """A spec error's message naming the file: the spec is parsed from its bytes, so YAML's
    own messages say "<byte string>" where the file name belongs."""
    return message.replace('"<byte string>"', f'"{path}"')


def _problems(exc: Exception, errors: list[dict[str, str]], path: Path) -> list[str]:
    """One line per problem, each with its field path and any suggestion."""
    from worker.errors import MalformedSpecError

    if not errors or isinstance(exc, MalformedSpecError):
        return [named(str(exc), path)]
    lines = []
    for e in errors:
        hint = f" (did you mean {e['suggestion']}?)" if e.get("suggestion") else ""
        lines.append(f"{e['loc']}: {named(e['msg'], path)}{hint}")
    return lines


XLA_CHANGES_DATA = (
    "dataset.xla is true: XLA compiles the generator into other code, and TensorFlow's "
    "stateless random ops then produce other numbers, so every batch differs from the same "
    "spec without XLA (not by rounding). The spec hash keeps the two apart; comparing a run "
    "with XLA to one without reports that their data differ."
)


STEPS_PER_EXECUTION_CHANGES_BITS = (
    "training.steps_per_execution is {n}: the steps run in a compiled loop, whose body "
    "TensorFlow optimises differently from a single step's, so the weights may differ in the "
    "last bits from the same spec with steps_per_execution 1. Reruns of this spec stay "
    "bitwise identical (the spec hash includes it); comparing it with a run of 1 step per "
    "call may report rounding differences."
)


def spec_warnings(spec: ExperimentSpec) -> list[str]:
    """What a valid spec does that its author may not expect."""
    from worker.spec import held_out_warnings

    n = spec.training.steps_per_execution
    return [
        *([XLA_CHANGES_DATA] if spec.dataset.xla else []),
        *([STEPS_PER_EXECUTION_CHANGES_BITS.format(n=n)] if n > 1 else []),
        *held_out_warnings(spec),
    ]


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
    spec: Annotated[
        Path, typer.Argument(help="a spec (YAML or JSON) to train here, or a script.py to submit")
    ],
    args: Annotated[
        list[str] | None,
        typer.Argument(help="the script's own arguments, after --", show_default=False),
    ] = None,
    out: Annotated[Path, typer.Option(help="result document to write")] = Path("result.json"),
    checkpoint_dir: Annotated[Path | None, typer.Option(help="keep epoch checkpoints here")] = None,
    resume: Annotated[bool, typer.Option(help="continue from the newest checkpoint")] = False,
    dataset: Annotated[
        Path | None, typer.Option(help="the dataset file the spec names in dataset.data")
    ] = None,
    export_model: Annotated[
        Path | None, typer.Option(help="on success, save the final model here (.keras)")
    ] = None,
    directory: Annotated[
        Path | None,
        typer.Option(
            "--dir", help="script: the directory shipped with it (default: the script's own)"
        ),
    ] = None,
    name: Annotated[str | None, typer.Option(help="script: the experiment's name")] = None,
    seed: Annotated[
        int | None, typer.Option(help="script: the run's seed (default: drawn)")
    ] = None,
    image: Annotated[str | None, typer.Option(help="script: the image it must run in")] = None,
    wait: Annotated[
        bool, typer.Option("--wait", help="script: wait until the run finishes")
    ] = False,
    timeout: Annotated[
        float | None, typer.Option(help="script: give up waiting after seconds")
    ] = None,
    api: ApiOption = DEFAULT_API,
    token: TokenOption = None,
    token_file: TokenFileOption = None,
    as_json: JsonFlag = False,
) -> None:
    """Train a spec here in a fresh process and write its result document; or submit
    your own training script (`repro run train.py -- --lr 0.01`) to run on a worker,
    its directory shipped by content digest, and reruns verified like any run's."""
    if spec.suffix == ".py":
        local = (out != Path("result.json"), checkpoint_dir, resume, dataset, export_model)
        _refuse_local_options(local)
        from service.cli.remote import submit_script

        submit_script(
            spec, list(args or []), directory=directory, name=name, seed=seed, image=image,
            wait=wait, timeout=timeout, client_options=(api, token, token_file), as_json=as_json,
        )  # fmt: skip
        return
    if args:
        err.print(f"[red]invalid:[/red] a spec takes no arguments, got {' '.join(args)}")
        raise typer.Exit(2)
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
    _show_result(result, spec, out, as_json=as_json)
    raise typer.Exit(code)


def _refuse_local_options(given: tuple[object, ...]) -> None:
    """Exit 2 naming the options of a local training (in `run`'s order) given with a script."""
    names = ("--out", "--checkpoint-dir", "--resume", "--dataset", "--export-model")
    if wrong := [name for name, value in zip(names, given, strict=True) if value]:
        err.print(f"[red]invalid:[/red] a script run does not take {', '.join(wrong)}")
        raise typer.Exit(2)


def _show_result(result: JobResult, spec: Path, out: Path, *, as_json: bool) -> None:
    """A local training's outcome: its result document (JSON), or a line saying it."""
    if as_json:
        emit_json(result.model_dump(mode="json", exclude={"provenance", "trace"}))
    elif result.status == "succeeded":
        typer.echo(f"succeeded  {result.final_fingerprint}  (result: {out})")
    else:
        message = result.error.message if result.error else result.status
        err.print(f"[red]{result.status}:[/red] ", end="")
        err.print(named(message, spec), markup=False, highlight=False)


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
    app.command(cls=Command)(validate)
    app.command(cls=Command)(run)
    app.command(name="verify", cls=Command)(verify)
