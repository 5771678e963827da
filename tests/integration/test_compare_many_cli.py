"""Three or more runs compared from the Python client and from `repro compare`, against a real
`repro serve` on SQLite and PostgreSQL: typed pairs and differing fields, the verdict matrix
on stdout, `--json`, the exit code, two runs compared as before, and the server's
`REPRO_MAX_COMPARE_RUNS` refusal reaching the user with its reason.

The runs are written into the server's database as completion stores them (see
dashboard_world), so no model is trained.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from reprotrain import ApiError, Client, RunsComparison
from tests.cli_runner import repro
from tests.integration import dashboard_world
from tests.integration.dashboard_world import World
from tests.integration.served_world import served_world
from tests.integration.service_procs import Service

MAX_RUNS = 4


def cli(service: Service, world: World, *args: str) -> tuple[int, str, str]:
    done = repro("compare", *args, "--api", service.url, "--token", world.viewer_token, timeout=120)
    return done.returncode, done.stdout, done.stderr


def shown_matrix(stdout: str, runs: list[int]) -> dict[tuple[int, int], str]:
    """(row run, column run) -> the verdict the printed matrix shows."""
    cells: dict[tuple[int, int], str] = {}
    for a in runs:
        row = re.search(rf"^  run {a}  (.*)$", stdout, re.MULTILINE)
        assert row is not None, stdout
        shown = re.split(r"\s{2,}", row[1].strip())
        assert len(shown) == len(runs), row[0]
        cells.update({(a, b): v for b, v in zip(runs, shown, strict=True)})
    return cells


def test_three_or_more_runs_from_the_client_and_the_cli(
    tmp_path: Path, database_url: str | None
) -> None:
    with served_world(tmp_path, database_url, max_compare_runs=MAX_RUNS) as (service, world, third):
        ref, same, div, failed = world.reference, world.identical, world.diverged, world.failed
        runs = [ref, same, third, div]
        with Client(service.url, world.viewer_token) as client:
            found = client.compare_runs(runs)
            assert isinstance(found, RunsComparison) and found.runs == runs
            assert not found.identical
            assert found.pair(div, ref).verdict == found.pair(same, div).verdict == "diverged"
            assert found.pair(ref, third).verdict == "identical"
            assert found.matrix()[0] == [None, "identical", "identical", "diverged"]
            # Only what differs: the third run's numpy, which can change the bits.
            assert [(d.field, d.values) for d in found.environment_diff] == [
                ("libraries.numpy", ["2.4.6", "2.4.6", "2.5.0", "2.4.6"])
            ]
            assert found.environment_diff[0].breaks_reproducibility
            assert found.spec_diff == []
            assert [c.run for c in found.curves["loss"]] == runs
            assert found.curves["loss"][0].points[0] == (1.0, pytest.approx(0.68))
            same_three = client.run(ref).compare_with(same, third)
            assert same_three.identical and len(same_three.pairs) == 3

        # The CLI: the matrix and the differing fields on stdout, 1 as a diverged pair gives.
        code, out, err = cli(service, world, *map(str, runs))
        assert code == 1, err
        cells = shown_matrix(out, runs)
        assert {cells[(div, r)] for r in runs if r != div} == {"diverged"}
        assert cells[(ref, same)] == cells[(third, ref)] == "identical" and cells[(div, div)] == "-"
        assert out.startswith("4 runs compared, 6 pairs: 3 identical, 3 diverged\n")
        numpy_row = re.search(r"^  \*  libraries\.numpy\s+(.*)$", out, re.MULTILINE)
        assert numpy_row is not None, out
        assert numpy_row[1].split() == ["2.4.6", "2.4.6", "2.5.0", "2.4.6"]
        assert "every run has the same spec" in out

        code, out, _ = cli(service, world, str(ref), str(same), str(failed), "--json")
        assert code == 1
        answer = json.loads(out)
        assert {(p["a"], p["b"]): p["verdict"] for p in answer["pairs"]} == {
            (ref, same): "identical", (ref, failed): "incomparable",
            (same, failed): "incomparable",
        }  # fmt: skip

        code, out, err = cli(service, world, str(ref), str(same), str(third))
        assert code == 0, err + out
        assert out.startswith("3 runs compared, 3 pairs: 3 identical\n")

        # Two runs: the two-run report, as before.
        code, out, _ = cli(service, world, str(ref), str(div))
        assert code == 1 and out.startswith(
            f"diverged at end of epoch 2 in {dashboard_world.DIVERGENT}"
        )


def test_too_many_or_unknown_runs_are_refused_with_the_reason(tmp_path: Path) -> None:
    with served_world(tmp_path, None, max_compare_runs=MAX_RUNS) as (service, world, third):
        five = [world.reference, world.identical, third, world.diverged, world.failed]
        said = f"at most {MAX_RUNS} runs can be compared at once (REPRO_MAX_COMPARE_RUNS)"
        with Client(service.url, world.viewer_token) as client:
            with pytest.raises(ApiError) as refused:
                client.compare_runs(five)
            assert refused.value.status_code == 422 and said in refused.value.reason
            with pytest.raises(ApiError) as unknown:
                client.compare_runs([world.reference, world.identical, 99_999])
            assert "no run 99999" in unknown.value.reason

        code, out, err = cli(service, world, *map(str, five))
        assert (code, out) == (2, "") and said in err, err
        code, out, err = cli(service, world, str(world.reference), "abc", str(third))
        assert (code, out) == (2, "") and "not a run id: abc" in err
        code, out, err = cli(service, world, str(world.reference), str(third), "--refine", "1")
        assert code == 2 and "--refine takes two runs" in err
