"""The result rows every section produces, and the one table they are printed as.

A row compares a measured figure with a baseline measured in the same run. `ratio` is
what the target is about; `met` is None for rows shown for information only.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

HEADER = ("benchmark", "configuration", "measured", "baseline", "ratio", "target", "met")


@dataclass
class Row:
    section: str  # one of run_all.SECTIONS: groups rows for --only, the plot and the README
    benchmark: str
    configuration: str
    unit: str  # how `measured` and `baseline` are shown; see fmt()
    measured: float
    baseline: float | None
    ratio: float | None
    target: str = ""  # shown as is, e.g. ">= 0.90"; empty: no target
    met: bool | None = None  # None: information only
    noisy: bool = False  # too few rounds had the CPU to themselves: not a result
    cause: str = ""  # for a target not met: why, and what would fix it (one line)
    params: dict[str, Any] = field(default_factory=dict)  # machine-readable configuration

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Row:
        return cls(**data)


def fmt(value: float | None, unit: str) -> str:
    """A value with its unit, scaled for reading."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if unit == "values/s":
        return f"{value / 1e6:.1f} Mvalues/s"
    if unit == "B/s":
        return f"{value / 1e9:.2f} GB/s" if value >= 1e9 else f"{value / 1e6:.0f} MB/s"
    if unit == "MB":
        return f"{value:.1f} MB"
    if unit == "s":
        return f"{value:.2f} s"
    if unit == "ms":
        return f"{value:.1f} ms" if value < 100 else f"{value:.0f} ms"
    if unit == "share":
        return f"{value * 100:.2f}%"
    if unit == "jobs":
        return f"{value:,.0f} jobs"
    if unit in ("req/s", "claims/s", "steps/s"):
        return f"{value:.0f} {unit}" if value >= 100 else f"{value:.1f} {unit}"
    return f"{value:.3g} {unit}"


def _met(row: Row) -> str:
    if row.met is None:
        return "(info)"
    return "yes" if row.met else "**no**"


def cells(row: Row) -> list[str]:
    # Three decimals below 0.1, and for a missed target, so that 0.896 never shows as 0.90.
    digits = 3 if row.ratio is not None and (row.ratio < 0.1 or row.met is False) else 2
    ratio = "-" if row.ratio is None else f"{row.ratio:.{digits}f}"
    ratio += "*" if row.noisy else ""
    return [
        row.benchmark,
        row.configuration,
        fmt(row.measured, row.unit),
        fmt(row.baseline, row.unit),
        ratio,
        row.target or "-",
        _met(row),
    ]


def render_table(rows: Sequence[Row]) -> str:
    """A Markdown table (readable as plain text too), with a footnote for noisy rows."""
    body = [cells(r) for r in rows]
    widths = [max(len(line[i]) for line in [list(HEADER), *body]) for i in range(len(HEADER))]

    def line(values: Sequence[str]) -> str:
        return "| " + " | ".join(v.ljust(w) for v, w in zip(values, widths, strict=True)) + " |"

    rule = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
    table = [line(HEADER), rule, *(line(values) for values in body)]
    if any(r.noisy for r in rows):
        table.append(
            "\n\\* fewer than the wanted rounds of this row had the CPU to themselves (other "
            "processes were busy): the figure includes their interference."
        )
    return "\n".join(table)


def target_summary(rows: Iterable[Row]) -> list[tuple[str, str, list[Row]]]:
    """(benchmark and target, status, rows not met) for each target, in table order."""
    groups: dict[tuple[str, str], list[Row]] = {}
    for row in rows:
        if row.met is not None:
            groups.setdefault((row.benchmark, row.target), []).append(row)
    summary = []
    for (benchmark, target), members in groups.items():
        missed = [r for r in members if not r.met]
        status = (
            f"met ({len(members)} of {len(members)})"
            if not missed
            else f"**not met** in {len(missed)} of {len(members)}"
        )
        summary.append((f"{benchmark} {target}", status, missed))
    return summary


def write_json(path: Path, rows: Sequence[Row], **extra: Any) -> None:
    path.write_text(json.dumps({**extra, "rows": [asdict(r) for r in rows]}, indent=2) + "\n")


def read_rows(path: Path) -> list[Row]:
    return [Row.from_dict(d) for d in json.loads(path.read_text())["rows"]]
