"""The job-vs-model.fit benchmark trains both for real and reports each comparison it made."""

from __future__ import annotations

from benchmarks import keras_baseline


def test_quick_run_compares_a_real_job_with_three_real_fits() -> None:
    rows = keras_baseline.measure(quick=True)
    assert [r.params["baseline"] for r in rows] == list(keras_baseline.FIT_MODES)
    for row in rows:
        assert row.section == "keras" and row.params["model"] == "mlp"
        assert row.measured > 0 and row.baseline is not None and row.baseline > 0
        assert row.ratio == row.measured / row.baseline
        # The job is the same measurement against every baseline.
        assert row.measured == rows[0].measured
    targeted = [r for r in rows if r.target]
    assert [r.params["baseline"] for r in targeted] == ["fit", "fit_nondeterministic"]
    assert all(r.met == (r.ratio >= 1.0) for r in targeted)
    assert all(bool(r.cause) == (not r.met) for r in targeted)
    assert rows[2].met is None and not rows[2].target
