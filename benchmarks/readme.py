"""Replacing the results block of benchmarks/README.md with those of a run.

The block sits between two marker comments, so the README's prose stays hand-written
while its figures are only ever written by `python -m benchmarks --write-readme`.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks.machine import describe
from benchmarks.rows import Row, render_table, target_summary

README = Path(__file__).resolve().parent / "README.md"
BEGIN = "<!-- results:begin (written by python -m benchmarks --write-readme) -->"
END = "<!-- results:end -->"


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
    lines = [
        f"Measured on {env['date']}: {describe(env)} (load average at the start and the end).",
        "",
        "```sh",
        command,
        "```",
        "",
        f"took {minutes} min {rest:02d} s ({parts}).",
        "",
        render_table(rows),
        "",
    ]
    if plot:
        lines += [f"![The main curves of this run]({plot})", ""]
    lines += ["Targets:", ""]
    for what, status, missed in target_summary(rows):
        lines.append(f"- {what}: {status}")
        lines += [f"  - {r.configuration}: {r.cause}" for r in missed]
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
