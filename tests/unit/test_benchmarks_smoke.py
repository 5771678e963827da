"""The benchmark command runs end to end and reports what it measured (never how fast)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from benchmarks.readme import BEGIN, END, README, replace_block

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
