"""`repro doctor`: what this machine, or a worker image, would record for a run and what
threatens reproducibility on it; exit 0 when nothing is flagged, 1 when something is."""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer

from service.cli.output import Command, JsonFlag, err, out


def doctor(
    image: Annotated[
        str | None,
        typer.Option(
            "--image",
            help="check inside a container of this local worker image, as a job would run",
        ),
    ] = None,
    as_json: JsonFlag = False,
) -> None:
    """Check GPUs, CUDA/cuDNN against the image's lock, TF32, op determinism, threads and the
    variables that steer GPU kernels; exit 1 if anything threatens bitwise reruns."""
    # TensorFlow and the docker SDK load only here: every other command starts fast.
    from worker.node import readiness_probe
    from worker.record import readiness

    try:
        report: dict[str, Any] = (
            readiness.check() if image is None else readiness_probe.in_image(image)
        )
    except Exception as exc:  # no engine, no such image, a container that printed no report
        err.print(f"the checks could not run: {type(exc).__name__}: {exc}", markup=False)
        raise typer.Exit(2) from None
    if as_json:
        print(json.dumps(report, sort_keys=True))
    else:
        for line in readiness.summary_lines(report):
            out.print(line, markup=False, highlight=False)
    raise typer.Exit(1 if report["flags"] else 0)


def register(app: typer.Typer) -> None:
    """Add this module's commands to the application."""
    app.command("doctor", cls=Command)(doctor)
