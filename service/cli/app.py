"""The typer application; each command group lives in its own module."""

from __future__ import annotations

import typer

from service.cli import (
    admin,
    code,
    datasets,
    doctor,
    experiments,
    local,
    models,
    remote,
    server,
    spot_checks,
)
from service.cli.output import Group

app = typer.Typer(
    cls=Group,
    add_completion=False,
    no_args_is_help=True,
    help="Reproducible training: submit, rerun and verify experiments.",
)
for module in (
    local,
    remote,
    server,
    admin,
    experiments,
    datasets,
    code,
    models,
    spot_checks,
    doctor,
):
    module.register(app)
