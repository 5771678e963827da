"""`repro doctor`: what this machine, or a worker image, would record for a run and what
threatens reproducibility on it; exit 0 when nothing is flagged, 1 when something is."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Annotated, Any

import typer

from service.cli.output import Command, JsonFlag, err, out

ReadinessCheck = Callable[[], dict[str, Any]]


def _check_here() -> dict[str, Any]:
    # TensorFlow loads only inside the check: every other command starts fast.
    from worker.record import readiness

    return readiness.check()


def _check_image(image: str) -> dict[str, Any]:
    # The docker SDK loads only here.
    from worker.node import readiness_probe

    return readiness_probe.in_image(image)


def doctor_command(check_here: ReadinessCheck = _check_here) -> Callable[..., None]:
    """The `repro doctor` command, with `check_here` as the checks of this machine."""

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
        """Check GPUs, CUDA/cuDNN against TensorFlow's build and the image's lock, TF32, op
        determinism, threads, the CPU and oneDNN, XLA flags and the variables that steer
        kernels; exit 1 if anything threatens bitwise reruns."""
        from worker.record import readiness

        try:
            report = check_here() if image is None else _check_image(image)
        except Exception as exc:  # no engine, no such image, a container that printed no report
            err.print(f"the checks could not run: {type(exc).__name__}: {exc}", markup=False)
            raise typer.Exit(2) from None
        if as_json:
            print(json.dumps(report, sort_keys=True))
        else:
            for line in readiness.summary_lines(report):
                out.print(line, markup=False, highlight=False)
        raise typer.Exit(1 if report["flags"] else 0)

    return doctor


def register(app: typer.Typer, *, check_here: ReadinessCheck = _check_here) -> None:
    """Add this module's commands to the application."""
    app.command("doctor", cls=Command)(doctor_command(check_here))
