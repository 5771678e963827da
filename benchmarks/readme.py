"""Replacing the results block of benchmarks/README.md with those of a run.

The block sits between two marker comments, so the README's prose stays hand-written
while its figures are only ever written by `python -m benchmarks --write-readme`.

The block shows the rows with a target; the rows for information and each miss's cause
are in the printed table and the JSON (`--json`), which would make the README several
times longer.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks.machine import describe
from benchmarks.rows import HEADER, Row, cells

README = Path(__file__).resolve().parent / "README.md"
BEGIN = "<!-- results:begin (written by python -m benchmarks --write-readme) -->"
END = "<!-- results:end -->"
INFO = "(info)"
MISSED = "**no**"


def target_table(body: Sequence[Sequence[str]]) -> str:
    """The rows with a target, from their cells (`rows.cells`), as a Markdown table.

    A benchmark's name, and its target, are written on the first of its consecutive rows only.
    """
    lines = ["| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    before: tuple[str, str] | None = None
    for benchmark, configuration, measured, baseline, ratio, target, met in body:
        if met == INFO:
            continue
        same = before == (benchmark, target)
        shown = ("", "") if same else (benchmark, target)
        values = [shown[0], configuration, measured, baseline, ratio, shown[1], met]
        lines.append("| " + " | ".join(values) + " |")
        before = (benchmark, target)
    if any(line[4].endswith("*") for line in body if line[6] != INFO):
        lines.append(
            "\n\\* fewer than the wanted rounds of this row had the CPU to themselves (other "
            "processes were busy): the figure includes their interference."
        )
    return "\n".join(lines)


def target_summary_line(body: Sequence[Sequence[str]]) -> str:
    """One sentence: how many targets were met in every row, and the rest with their misses."""
    groups: dict[tuple[str, str], list[str]] = {}
    for line in body:
        if line[6] != INFO:
            groups.setdefault((line[0], line[5]), []).append(line[6])
    missed = [
        f"{benchmark} {target} in {mets.count(MISSED)} of {len(mets)} rows"
        for (benchmark, target), mets in groups.items()
        if MISSED in mets
    ]
    met = f"Targets met in every row: {len(groups) - len(missed)} of {len(groups)}"
    return f"{met}; not met: {'; '.join(missed)}." if missed else f"{met}."


def results_block(
    rows: Sequence[Row],
    *,
    env: dict[str, Any],
    command: str,
    total: float,
    seconds: dict[str, float],
    plot: str | None,
) -> str:
    minutes, rest = divmod(round(total), 60)
    parts = ", ".join(f"{name} {s:.0f} s" for name, s in seconds.items())
    body = [cells(r) for r in rows]
    lines = [
        f"Measured on {env['date']}: {describe(env)} (load average at the start and the end).",
        f"`{command}` took {minutes} min {rest:02d} s ({parts}).",
        "",
        target_table(body),
        "",
        target_summary_line(body),
        "",
    ]
    if plot:
        lines += [f"![The main curves of this run]({plot})", ""]
    return "\n".join(lines)


def replace_block(text: str, block: str) -> str:
    """The README text with its results block replaced; ValueError without the markers."""
    try:
        head, rest = text.split(BEGIN, 1)
        _, tail = rest.split(END, 1)
    except ValueError:
        raise ValueError(f"the README needs the lines {BEGIN!r} and {END!r}") from None
    return f"{head}{BEGIN}\n{block}\n{END}{tail}"


def write_readme(
    path: Path,
    rows: Sequence[Row],
    *,
    env: dict[str, Any],
    command: str,
    total: float,
    seconds: dict[str, float],
    plot: str | None = "results.png",
) -> None:
    block = results_block(rows, env=env, command=command, total=total, seconds=seconds, plot=plot)
    path.write_text(replace_block(path.read_text(), block))
