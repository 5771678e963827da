"""The suite's positive control: on this GPU, without op determinism, reruns of a model whose
embedding gradients are summed by atomic GPU kernels differ at least once in a few tries,
and with op determinism they are identical. Were the reruns without it identical too, the
suite's identical verdicts would show nothing about the kernels op determinism chooses."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.gpu.gpu_jobs import (
    ONE_GPU,
    FingerprintPair,
    assert_same_training,
    final_fingerprint,
    run_on,
    run_until_differ,
)
from tests.gpu.gpu_specs import embedding_control_spec

pytestmark = pytest.mark.gpu

CONTROL_PAIRS = 3
# Whatever the environment of the test process says, the control's jobs run without
# TensorFlow's determinism switch; the job records the value it saw.
NO_DETERMINISM = {"TF_DETERMINISTIC_OPS": "0"}


def test_reruns_without_op_determinism_differ_and_with_it_are_identical(
    gpu: dict[str, Any], tmp_path: Path
) -> None:
    spec = embedding_control_spec(op_determinism=False)

    def run_pair(i: int) -> FingerprintPair:
        pair = []
        for side in ("a", "b"):
            result = run_on(
                spec, tmp_path / f"off-{i}-{side}", devices=ONE_GPU, gpus=1, env=NO_DETERMINISM
            )
            assert result.determinism["op_determinism"] is False
            assert result.determinism["tf_deterministic_ops_env"] == "0"
            pair.append(final_fingerprint(result))
        return pair[0], pair[1]

    verdict = run_until_differ(run_pair, tries=CONTROL_PAIRS)
    assert verdict.passed, verdict.reason

    deterministic = embedding_control_spec(op_determinism=True)
    a = run_on(deterministic, tmp_path / "on-a", devices=ONE_GPU, gpus=1)
    b = run_on(deterministic, tmp_path / "on-b", devices=ONE_GPU, gpus=1)
    assert a.determinism["op_determinism"] is True
    assert_same_training(a, b)
