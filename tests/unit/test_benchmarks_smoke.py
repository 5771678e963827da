"""The benchmark command runs end to end and reports what it measured (never how fast)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from benchmarks import api_throughput, arrays_pipeline
from benchmarks.load_api import Figures
from benchmarks.readme import BEGIN, END, README, replace_block, results_block
from benchmarks.rounds import Timed
from benchmarks.rows import Row

REPO = Path(__file__).resolve().parents[2]
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def test_quick_run_prints_its_rows_and_writes_the_plot(tmp_path: Path) -> None:
    plot, rows_json = tmp_path / "results.png", tmp_path / "rows.json"
    outputs = ["--json", str(rows_json), "--plot", str(plot)]
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks", "--quick", "--only", "fingerprint", *outputs],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    rows = json.loads(rows_json.read_text())["rows"]
    assert {r["section"] for r in rows} == {"fingerprint"}
    assert all(r["ratio"] > 0 and r["met"] in (True, False) for r in rows)
    # Each row of the JSON is a row of the printed table, with its target.
    for row in rows:
        line = next(ln for ln in done.stdout.splitlines() if row["configuration"] in ln)
        assert row["benchmark"] in line
        assert ">= 0.80" in line
    assert plot.read_bytes().startswith(PNG_SIGNATURE)


def test_readme_results_are_replaced_between_the_markers_only() -> None:
    text = README.read_text()
    assert text.count(BEGIN) == 1 and text.count(END) == 1
    replaced = replace_block(text, "new figures")
    head, tail = text.split(BEGIN)[0], text.split(END)[1]
    assert replaced == f"{head}{BEGIN}\nnew figures\n{END}{tail}"
    assert replace_block(replaced, "newer") == replace_block(text, "newer")


def test_readme_results_show_the_rows_with_a_target_and_what_missed() -> None:
    def row(configuration: str, ratio: float, met: bool | None, target: str = ">= 0.90") -> Row:
        return Row(
            section="pipeline",
            benchmark="input pipeline vs fused op",
            configuration=configuration,
            unit="values/s",
            measured=ratio * 100e6,
            baseline=100e6,
            ratio=ratio,
            target=target if met is not None else "",
            met=met,
            cause="why" if met is False else "",
        )

    rows = [row("B=64", 0.645, False), row("Python loop", 0.46, None), row("B=256", 0.95, True)]
    env = {
        "date": "2026-11-26",
        "cpu_count": 2,
        "cpu_model": "AMD EPYC",
        "memory_gib": 23.5,
        "python": "3.11.7",
        "tensorflow": "2.21.0",
        "keras": "3.15.1",
        "numpy": "2.4.6",
        "blake3": "1.0.11",
        "sqlite": "3.40.1",
        "postgresql": "15.18",
        "loadavg_start": [1.1],
    }
    block = results_block(
        rows, env=env, command="python -m benchmarks", total=514, seconds={}, plot="results.png"
    )
    table = [line for line in block.splitlines() if line.startswith("| ")]
    # The info row stays in the printed table and the JSON; the benchmark is named once.
    assert "Python loop" not in block and len(table) == 3
    assert table[1].startswith("| input pipeline vs fused op | B=64 | 64.5 Mvalues/s")
    assert table[2].startswith("|  | B=256 | ") and "| 0.95 |  | yes |" in table[2]
    assert "took 8 min 34 s" in block and "![The main curves of this run](results.png)" in block
    assert "not met: input pipeline vs fused op >= 0.90 in 1 of 2 rows." in block


def test_training_rows_come_from_the_keras_sections_jobs(tmp_path: Path) -> None:
    # One command with both sections: the job-vs-model.fit rows for every baseline, and the
    # determinism and trace rows built from the same processes (none started twice).
    rows_json = tmp_path / "rows.json"
    sections = ["--only", "training", "--only", "keras"]
    outputs = ["--json", str(rows_json), "--plot", str(tmp_path / "results.png")]
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks", "--quick", *sections, *outputs],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=420,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    rows = json.loads(rows_json.read_text())["rows"]
    keras = [r for r in rows if r["section"] == "keras"]
    assert all(r["measured"] > 0 and r["baseline"] > 0 for r in keras)
    walls = [r for r in keras if r["benchmark"] == "whole process vs a model.fit script"]
    assert sorted((r["params"]["job"], r["params"]["baseline"]) for r in walls) == [
        ("job", "fit"),
        ("job_steps_per_execution", "fit_steps_per_execution"),
    ]
    keras = [r for r in keras if r not in walls]
    assert sorted((r["params"]["job"], r["params"]["baseline"]) for r in keras) == [
        ("job", "fit"),
        ("job", "fit_nondeterministic"),
        ("job", "fit_steps_per_execution"),
        ("job_steps_per_execution", "fit_steps_per_execution"),
    ]
    # The job with steps_per_execution in its spec runs several steps per compiled call.
    (looped,) = [r for r in keras if r["params"]["job"] == "job_steps_per_execution"]
    assert looped["params"]["job_steps_per_call"] > 1
    keras = [r for r in keras if r is not looped]
    (trace,) = [r for r in rows if r["section"] == "trace"]
    (determinism,) = [r for r in rows if r["section"] == "determinism"]
    assert "mlp, 1 job," in trace["configuration"]
    # The determinism ratio is that of the keras rows' model.fit runs, on (a) and off (b).
    fit = {r["params"]["baseline"]: r["baseline"] for r in keras}
    assert determinism["configuration"].endswith(", model.fit")
    assert (determinism["measured"], determinism["baseline"]) == (
        fit["fit"],
        fit["fit_nondeterministic"],
    )
    assert "training mlp, op determinism" not in done.stderr  # it started no job of its own


def test_only_a_full_run_replaces_the_readmes_plot_by_default() -> None:
    from benchmarks.run_all import DEFAULT_PLOT, parse_args

    assert parse_args([]).plot == DEFAULT_PLOT
    assert parse_args(["--only", "api"]).plot is None
    assert parse_args(["--quick"]).plot is None
    assert parse_args(["--quick", "--plot", "x.png"]).plot == Path("x.png")


def _timed_batch(name: str, batch_us: float, batch: int = 256, batches: int = 32) -> Timed:
    """A side of the arrays section whose best pass took `batch_us` a batch."""
    values = batches * batch * (32 * 32 * 3 + 1)
    return Timed(name, lambda: values, values, [batch_us * batches / 1e6], [True])


def test_an_arrays_miss_splits_its_gap_into_the_crop_and_the_rest() -> None:
    # The figures of a run of the section (us a batch at B=256).
    cause = arrays_pipeline._cause(
        256,
        _timed_batch("arrays", 8685),
        _timed_batch("baseline", 7783),
        _timed_batch("arrays, no crop or flip", 6968),
        _timed_batch("baseline, no crop or flip", 6371),
    )
    assert cause.startswith("902 us a batch more than the baseline's 7783 us")
    assert "cost the generator 1717 us a batch" in cause
    assert "and the baseline 1412 us" in cause
    # The two parts add up to the gap: 305 + 597 = 902.
    assert "+305 us of the gap; without them the generator is at 0.91 of the baseline" in cause
    assert "597 us a batch behind" in cause
    # A run where the pair without crop and flip came out ahead: the crop is the whole gap.
    ahead = arrays_pipeline._cause(
        256,
        _timed_batch("arrays", 9957),
        _timed_batch("baseline", 8415),
        _timed_batch("arrays, no crop or flip", 7294),
        _timed_batch("baseline, no crop or flip", 7766),
    )
    assert "+2014 us of the gap" in ahead
    assert "at 1.06 of the baseline, 472 us a batch ahead, so the crop and the flip" in ahead


def _window(kind: str, rps: float, errors: int = 0) -> Figures:
    return Figures(kind, int(rps * 2), rps, errors, errors / (rps * 2), 10.0, 20.0, 30.0, 40.0)


def test_api_rows_keep_each_sides_best_round_and_never_hide_failures() -> None:
    rounds = {
        "healthz": [_window("healthz", 2000.0), _window("healthz", 2400.0)],
        "get_run": [_window("get_run", 700.0), _window("get_run", 600.0)],
        "list_runs": [_window("list_runs", 500.0, errors=3), _window("list_runs", 560.0)],
    }
    assert api_throughput.best(rounds["healthz"]).rps == 2400.0
    assert api_throughput.best(rounds["get_run"]).rps == 700.0
    # The slower round failed requests: the row shows that round, failures and all.
    assert api_throughput.best(rounds["list_runs"]).rps == 500.0
