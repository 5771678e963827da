"""The job-vs-model.fit benchmark trains both for real and reports each comparison it made."""

from __future__ import annotations

from benchmarks import keras_baseline


def test_quick_run_compares_real_jobs_with_real_fits() -> None:
    rows = keras_baseline.measure(quick=True)
    speed = [r for r in rows if r.benchmark == "job steps/s vs plain Keras"]
    wall = [r for r in rows if r.benchmark == "whole process vs a model.fit script"]
    assert len(speed) + len(wall) == len(rows)
    assert [(r.params["job"], r.params["baseline"]) for r in speed] == [
        ("job", "fit"),
        ("job", "fit_nondeterministic"),
        ("job", "fit_steps_per_execution"),
        ("job_steps_per_execution", "fit_steps_per_execution"),
    ]
    for row in speed:
        assert row.section == "keras" and row.params["model"] == "mlp"
        assert row.measured > 0 and row.baseline is not None and row.baseline > 0
        assert row.ratio == row.measured / row.baseline
    # The plain job is one measurement against every baseline.
    assert speed[0].measured == speed[1].measured == speed[2].measured
    assert speed[3].params["job_steps_per_call"] == keras_baseline.STEPS_PER_EXECUTION
    # Targets: the plain job against fit with op determinism on and off; the looped job
    # against fit with as many steps per call (the MLP is one of the targeted models).
    targeted = [r for r in speed if r.target]
    assert targeted == [speed[0], speed[1], speed[3]]
    assert all(r.met == (r.ratio >= keras_baseline.TARGET) for r in targeted)
    assert all(bool(r.cause) == (not r.met) for r in targeted)
    assert speed[2].met is None
    # The whole process, start to exit: fit's time over the job's.
    assert [(r.params["job"], r.params["baseline"]) for r in wall] == [
        ("job", "fit"),
        ("job_steps_per_execution", "fit_steps_per_execution"),
    ]
    for row in wall:
        assert row.baseline is not None and row.measured > 0
        assert row.ratio == row.baseline / row.measured
        assert row.met == (row.ratio >= keras_baseline.WALL_TARGET)
