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
