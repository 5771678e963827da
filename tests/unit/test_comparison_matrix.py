"""N-way comparison without a database: run lists as users type them, pair verdicts that
agree with the full report, fields differing among N runs, and charts readable on hover."""

from __future__ import annotations

import re
from typing import Any

import pytest

from service.dashboard import charts
from service.errors import InvalidQuery
from service.verification.comparison_matrix import _across, parse_run_ids
from worker.compare.verdict import RunRecord, build_report, verdict_of


def test_run_lists_are_read_as_typed_and_repeated() -> None:
    assert parse_run_ids(["3, 1,2", "3", "4"], max_runs=5) == [3, 1, 2, 4]
    assert parse_run_ids(["7", "8"], max_runs=2) == [7, 8]


@pytest.mark.parametrize(
    ("values", "says"),
    [
        (["1,x"], "'x' is not a run id"),
        (["1,²"], "is not a run id"),  # a digit to str.isdigit, not a run id
        (["1,0"], "0 is not a run id"),
        (["1,2,3"], "at most 2 runs"),
        (["5,5"], "at least two different runs"),
        ([""], "at least two different runs"),
    ],
)
def test_bad_run_lists_say_why(values: list[str], says: str) -> None:
    with pytest.raises(InvalidQuery) as refused:
        parse_run_ids(values, max_runs=2)
    assert says in str(refused.value) and refused.value.status_code == 422
    assert refused.value.errors == [{"loc": "query.runs", "msg": str(refused.value)}]


def point(kind: str, epoch: int, tag: str) -> dict[str, Any]:
    return {"kind": kind, "epoch": epoch, "step": epoch * 4, "fingerprint": f"{tag}{epoch}",
            "variables": {"w": f"{tag}{epoch}"}}  # fmt: skip


def record(
    diverge_at: int | None = None, *, status: str = "succeeded", spec: str = "s", epochs: int = 3,
    granularity: str = "epoch",
) -> RunRecord:  # fmt: skip
    trace = [
        point("init" if e == 0 else "epoch", e, "b" if diverge_at is not None and e >= diverge_at
              else "a")
        for e in range(epochs + 1)
    ]  # fmt: skip
    return RunRecord(
        label="run", status=status, spec_hash=spec, granularity=granularity,
        final_fingerprint=trace[-1]["fingerprint"], trace=trace, spec={"seed": spec},
    )  # fmt: skip


PAIRS = [
    (record(), record()),
    (record(), record(2)),
    (record(), record(0)),
    (record(), record(status="failed")),
    (record(), record(granularity="step")),
    (record(), record(epochs=2)),
    (record(), record(spec="t")),
    (record(), record(2, spec="t")),
]


@pytest.mark.parametrize(("a", "b"), PAIRS)
def test_a_pair_verdict_is_the_full_reports_verdict(a: RunRecord, b: RunRecord) -> None:
    verdict, reason = verdict_of(a, b)
    report = build_report(a, b)
    assert verdict == report["verdict"]
    if verdict == "incomparable":
        assert reason in report["reason"]
    elif verdict == "diverged":
        assert reason == f"diverged at {report['first_divergence']['label']}"


def test_fields_differing_among_runs_are_found_from_diffs_against_the_first() -> None:
    # Runs 1 and 2 differ from each other in `b` while both differ from run 0 in it.
    diffs: list[list[dict[str, Any]]] = [
        [{"field": "b", "a": 1, "b": 2}, {"field": "c", "a": "x", "b": "y"}],
        [{"field": "b", "a": 1, "b": 3}],
        [],
    ]
    rows = _across(diffs, "field", 4)
    assert [(r["field"], r["values"]) for r in rows] == [
        ("b", [1, 2, 3, 1]),
        ("c", ["x", "y", "x", "x"]),
    ]


def test_every_point_of_every_line_has_a_value_on_hover() -> None:
    drawn = charts.line_chart(
        [charts.Series("run 1", [(1, 0.5), (2, 0.25)]), charts.Series("run 2", [(1, 0.5)])],
        title="loss",
    )
    titles = re.findall(r'<circle class="point"[^>]*><title>([^<]+)</title>', drawn)
    assert titles == ["run 1 · epoch 1 · loss 0.5", "run 1 · epoch 2 · loss 0.25",
                      "run 2 · epoch 1 · loss 0.5"]  # fmt: skip


def test_long_curves_keep_hover_values_bounded_and_the_last_point() -> None:
    points = [(float(e), 1.0 / (e + 1)) for e in range(1001)]
    drawn = charts.line_chart([charts.Series("run 9", points)], title="loss")
    titles = re.findall(r"<title>(run 9 · epoch [^<]+)</title>", drawn)
    assert len(titles) <= charts.MAX_HOVER_POINTS + 1
    assert titles[-1].startswith("run 9 · epoch 1000 ·")


def test_many_overlaid_runs_look_different_and_keep_their_legend_clear_of_the_plot() -> None:
    series = [charts.Series(f"run {i}", [(1, 1.0), (2, 0.5)]) for i in range(10)]
    drawn = charts.line_chart(series, title="loss", height=220)
    styles = re.findall(r'<polyline fill="none" stroke="([^"]+)" stroke-width="2"([^>]*?) points',
                        drawn)  # fmt: skip
    assert len(set(styles)) == 10
    legend_y = [int(y) for y in re.findall(r'<g class="legend-entry"><line [^>]*y1="(\d+)"', drawn)]
    assert len(legend_y) == 10 and min(legend_y) > 220  # below the plot, not over the lines
    assert 'height="' in drawn and int(re.findall(r'height="(\d+)"', drawn)[0]) > max(legend_y)
