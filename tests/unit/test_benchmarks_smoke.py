"""The benchmark command runs end to end and reports what it measured (never how fast)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from benchmarks import api_throughput, arrays_pipeline
from benchmarks.load_api import Figures
from benchmarks.pipeline import TARGET, _cause, with_one_core_bound
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
    assert sorted(r["params"]["baseline"] for r in keras) == [
        "fit",
        "fit_nondeterministic",
        "fit_steps_per_execution",
    ]
    assert all(r["measured"] > 0 and r["baseline"] > 0 for r in keras)
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


def _pipeline_row(batch: int, cores: int, measured: float, fused: float) -> Row:
    ratio = measured / fused
    return Row(
        section="pipeline",
        benchmark="input pipeline vs fused op",
        configuration=f"B={batch}, {cores} cores",
        unit="values/s",
        measured=measured,
        baseline=fused,
        ratio=ratio,
        target=f">= {TARGET:.2f}",
        met=ratio >= TARGET,
        cause="" if ratio >= TARGET else "per-process cause",
        params={"pipeline": "in_graph", "batch": batch, "cores": cores},
    )


def test_a_multi_core_pipeline_miss_says_what_one_cores_rate_allows() -> None:
    # The figures of a published full run (Mvalues/s): fused op 161.4 on 2 cores, 83.5 on 1.
    rows = [
        _pipeline_row(64, 2, 106.8e6, 161.4e6),
        _pipeline_row(256, 2, 140.1e6, 161.4e6),
        _pipeline_row(1024, 2, 149.9e6, 161.4e6),
        _pipeline_row(64, 1, 65.8e6, 83.5e6),
        _pipeline_row(256, 1, 76.7e6, 83.5e6),
        _pipeline_row(1024, 1, 80.2e6, 83.5e6),
    ]
    b64, b256, b1024, one64, one256, one1024 = with_one_core_bound(rows)
    # Two cores each making batch 64's 1-core 65.8 Mvalues/s: 131.6 of 161.4, 0.815.
    assert b64.cause.startswith("per-process cause; one core's pipeline")
    assert "65.8 Mvalues/s (0.79 of the fused op on one core)" in b64.cause
    assert "reach 0.82 of this ceiling, so the fixed cost per batch alone" in b64.cause
    assert "kept 0.81 of that bound" in b64.cause
    # At batch 256 two such would reach 0.95 of it: the loss is in running side by side.
    assert "reach 0.95 of this ceiling, so the gap is in running side by side: 0.91" in b256.cause
    # Rows that met their target, and the 1-core rows, keep their causes.
    assert b1024.cause == "" and one1024.cause == ""
    assert one64.cause == "per-process cause" and one256.cause == ""


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


def test_a_pipeline_miss_beside_an_as_fast_serial_map_names_the_fixed_cost_where_it_fits() -> None:
    # Figures of a full run: batch 64 (49 us over the fused op's 103, the fixed cost per
    # element itself) and batch 4096 (1259 us over 6614, 26 times it), each with a parallel
    # map no faster than a serial one.
    small = _cause(49, 49, 103, 0.42, parallel=0.679, serial=0.68)
    large = _cause(1259, 49, 6614, 0.52, parallel=0.84, serial=0.81)
    for cause in (small, large):
        assert "one batch's ops already spread over the cores" in cause
    assert "1.00 times a serial map (0.68 of the ceiling)" in small
    assert "several batches per map call" in small and "times the fixed cost" not in small
    assert "1.04 times a serial map (0.81 of the ceiling)" in large
    assert "by 26 times the fixed cost per element" in large
    assert "several batches per map call" not in large


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
    # A miss's cause gives each round's ratio against /healthz of the same round.
    assert api_throughput._by_round(rounds, "get_run").endswith(": 0.350, 0.250")


def test_an_api_miss_says_what_the_machines_cpu_per_request_allows() -> None:
    # The figures of a run of the section: a PostgreSQL page against /healthz.
    page = _window("list_runs", 524.0)
    page.server_cpu_ms, page.database_cpu_ms, page.client_cpu_ms = 1.48, 0.67, 0.93
    page.server_switches = 1.0
    floor = _window("healthz", 2342.0)
    floor.server_cpu_ms, floor.database_cpu_ms, floor.client_cpu_ms = 0.25, 0.0, 0.49
    floor.server_switches = 0.5
    cause = api_throughput._cause(page, floor, "postgresql")
    assert "the server spends 1.48 ms of CPU per request against 0.25 ms" in cause
    # 0.74 / (1.48 + 0.67 + 0.93) = 0.24
    assert "the server, PostgreSQL and the load clients together spend 3.08 ms" in cause
    assert "against 0.74 ms for /healthz, which on cores kept busy allows 0.24 of its rate" in cause
