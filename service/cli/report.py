"""Printing a comparison report for people: the verdict, the explanation, then the details."""

from __future__ import annotations

import textwrap
from collections.abc import Mapping
from typing import Any

import typer

from service.cli.output import text_table
from worker.compare.verdict import describe

_WIDTH = 100
_SHOWN_ROWS = 20


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.3g}"
    return str(value)


def report_lines(report: Mapping[str, Any]) -> list[str]:
    """The report as lines of text: one-line verdict, explanation, then the evidence."""
    lines = [describe(report)]
    if report.get("explanation"):
        lines += ["", *textwrap.wrap(report["explanation"], _WIDTH)]
    spec_diff = report.get("spec_diff") or []
    if spec_diff:
        lines += ["", "spec differences:"]
        rows = [[d["path"], _cell(d["a"]), _cell(d["b"])] for d in spec_diff[:_SHOWN_ROWS]]
        lines += text_table(["field", "a", "b"], rows)
        equal, differing = report.get("data_epochs_equal"), report.get("data_epochs_differing")
        if equal or differing:
            lines.append(
                f"data fingerprints: {len(equal or [])} epochs equal, "
                f"{len(differing or [])} different"
                + (f" (epochs {', '.join(map(str, differing[:_SHOWN_ROWS]))})" if differing else "")
            )
    if report["verdict"] == "diverged":
        div, last = report["first_divergence"], report.get("last_identical")
        lines += [
            "",
            f"first divergence   {div['label']}"
            f"  (last identical: {last['label'] if last else 'none'}; "
            f"{report['points_inspected']} of {report['points']} trace points inspected)",
        ]
        data = report["data"]
        state = {True: "equal", False: "DIFFERENT", None: "not recorded"}[data["equal"]]
        lines.append(f"data of epoch {data['epoch']:<4} {state}")
        rows = [
            [
                d["variable"],
                _cell(d.get("max_abs_diff")),
                _cell(d.get("relative_norm")),
                _cell(d.get("max_ulp")),
                f"{_cell(d.get('elements_differing'))}/{_cell(d.get('elements'))}",
                d.get("note") or "",  # why a size is "-": shapes or dtypes differ...
            ]
            for d in report["differences"][:_SHOWN_ROWS]
        ]
        measured = report.get("differences_measured_at")
        if rows and measured:
            lines += ["", f"differences at the {measured['label']}:"]
            header = ["variable", "max |Δ|", "rel. norm", "max ULP", "differing", "note"]
            if not any(row[-1] for row in rows):
                header, rows = header[:-1], [row[:-1] for row in rows]
            lines += text_table(header, rows)
        elif report["variables"]:
            lines += ["", "differing variables: " + ", ".join(report["variables"][:_SHOWN_ROWS])]
        if report.get("differences_note"):
            lines.append(f"  ({report['differences_note']})")
    diff = report.get("provenance_diff") or []
    if diff:
        lines += ["", "environment differences (* can change results):"]
        lines += text_table(
            ["", "field", "a", "b"],
            [
                [
                    "*" if d["breaks_reproducibility"] else "",
                    d["field"],
                    _cell(d["a"]),
                    _cell(d["b"]),
                ]
                for d in diff[:_SHOWN_ROWS]
            ],
        )
    elif report["verdict"] != "incomparable":
        lines += ["", "environment: no recorded field differs"]
    return lines


def print_report(report: Mapping[str, Any]) -> None:
    """Print the report to standard output."""
    for line in report_lines(report):
        typer.echo(line)
