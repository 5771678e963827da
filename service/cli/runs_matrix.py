"""Printing an N-way comparison for people: a summary line, each pair's verdict as a matrix,
then the spec and environment fields that differ among the runs (only those)."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import typer

from service.cli.output import text_table

if TYPE_CHECKING:
    from reprotrain import DifferingField, RunsComparison

_SHOWN = {"identical": "identical", "diverged": "diverged", "incomparable": "not comparable"}


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, str):
        return value
    if isinstance(value, float):
        return f"{value:.6g}"
    return json.dumps(value, sort_keys=True, default=str)


def summary(found: RunsComparison) -> str:
    """One line: how many runs, and how many pairs had each verdict."""
    counts = Counter(p.verdict for p in found.pairs)
    said = ", ".join(f"{counts[v]} {_SHOWN[v]}" for v in _SHOWN if counts[v])
    return f"{len(found.runs)} runs compared, {len(found.pairs)} pairs: {said}"


def _fields(
    title: str, fields: Sequence[DifferingField], runs: Sequence[int], *, marked: bool
) -> list[str]:
    header = ["field", *(f"run {r}" for r in runs)]
    rows = [[d.field, *map(_cell, d.values)] for d in fields]
    if marked:
        header.insert(0, "")
        for row, d in zip(rows, fields, strict=True):
            row.insert(0, "*" if d.breaks_reproducibility else "")
    return ["", title, *text_table(header, rows)]


def matrix_lines(found: RunsComparison) -> list[str]:
    """The comparison as lines of text."""
    header = ["", *(f"run {r}" for r in found.runs)]
    rows = [
        [f"run {a}", *(_SHOWN[v] if v else "-" for v in row)]
        for a, row in zip(found.runs, found.matrix(), strict=True)
    ]
    lines = [summary(found), "", "verdicts (each column's run against each row's run):"]
    lines += text_table(header, rows)
    if found.spec_diff:
        lines += _fields("spec fields that differ:", found.spec_diff, found.runs, marked=False)
    else:
        lines += ["", "every run has the same spec"]
    if found.environment_diff:
        title = "environment fields that differ (* can change results):"
        lines += _fields(title, found.environment_diff, found.runs, marked=True)
    else:
        lines += ["", "no recorded environment field differs"]
    return lines


def print_matrix(found: RunsComparison) -> None:
    """Print the comparison on stdout."""
    for line in matrix_lines(found):
        typer.echo(line)
