"""Several optimizer steps per compiled call change no trace, fingerprint or metric."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.integration.jobs import REPO, run_job
from worker.spec import load_spec

pytestmark = pytest.mark.slow

EXAMPLES = sorted(p for p in (REPO / "examples").iterdir() if p.suffix in (".yaml", ".json"))


def test_every_example_gives_identical_traces_with_one_or_several_steps_per_call(
    tmp_path: Path,
) -> None:
    assert len(EXAMPLES) >= 4
    for example in EXAMPLES:
        spec = load_spec(example)
        # A null seed would be drawn anew by each run; both runs must train the same experiment.
        fixed = spec if spec.seed is not None else spec.with_seed((20261123, 0))
        data = fixed.model_dump(mode="json")
        one = run_job(data, tmp_path / example.stem / "one", "--steps-per-call", "1").result
        many = run_job(data, tmp_path / example.stem / "many", "--steps-per-call", "16").result
        assert one.status == many.status == "succeeded", (example.name, one.error, many.error)
        steps = spec.training.epochs * spec.dataset.train_batches
        assert one.timings["train_calls"] == steps
        assert many.timings["train_calls"] < steps, example.name  # several steps per call ran
        assert many.trace == one.trace, example.name
        assert many.final_fingerprint == one.final_fingerprint
        assert many.data_fingerprints == one.data_fingerprints
        assert many.eval_data_fingerprint == one.eval_data_fingerprint
        drop = ("seconds",)
        assert [{k: v for k, v in r.items() if k not in drop} for r in many.metrics] == [
            {k: v for k, v in r.items() if k not in drop} for r in one.metrics
        ], example.name
