"""Running the GPU suite's jobs on chosen GPUs, and the verdicts on their results: two runs
trained identically, or (the positive control) reruns that differed at least once."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from tests.integration.jobs import Finished, run_job
from worker.compare.verdict import build_report, record_from_result
from worker.result import JobResult

ONE_GPU = "0"  # CUDA_VISIBLE_DEVICES of a one-GPU job: the guarantee is per GPU model and count
Status = Literal["succeeded", "failed", "interrupted"]
FingerprintPair = tuple[str | None, str | None]


def checked_result(done: Finished, *, gpus: int, status: Status = "succeeded") -> JobResult:
    """The job's result, once it ended as `status` with TensorFlow seeing exactly `gpus` GPUs
    (AssertionError saying what happened otherwise)."""
    result = done.result
    error = result.error.message if result.error is not None else None
    assert result.status == status, (
        f"the job ended {result.status!r}, not {status!r} (exit {done.returncode}): "
        f"{error or done.stderr[-3000:]}"
    )
    seen = result.provenance.get("tf_gpus") or []
    assert len(seen) == gpus, (
        f"TensorFlow saw {len(seen)} GPU(s), not {gpus}: {[g.get('name') for g in seen]}"
    )
    return result


def run_on(
    spec: dict[str, Any],
    workdir: Path,
    *args: str,
    devices: str,
    gpus: int,
    status: Status = "succeeded",
    env: dict[str, str] | None = None,
) -> JobResult:
    """Run `python -m worker.run` on the GPUs `devices` names (CUDA_VISIBLE_DEVICES) and
    return its result, checked by `checked_result`."""
    done = run_job(spec, workdir, *args, env={**(env or {}), "CUDA_VISIBLE_DEVICES": devices})
    return checked_result(done, gpus=gpus, status=status)


def final_fingerprint(result: JobResult) -> str:
    """The fingerprint of the run's final weights (AssertionError if it has none)."""
    assert result.final_fingerprint is not None, f"a {result.status} run has no final fingerprint"
    return result.final_fingerprint


def assert_same_training(a: JobResult, b: JobResult) -> None:
    """AssertionError unless the runs trained bit for bit alike: equal final fingerprints,
    traces and data fingerprints, and a comparison report saying `identical`."""
    assert final_fingerprint(a) == final_fingerprint(b)
    assert a.trace == b.trace
    assert a.data_fingerprints == b.data_fingerprints
    report = build_report(record_from_result(a, "a"), record_from_result(b, "b"))
    assert report["verdict"] == "identical", report.get("explanation")


@dataclass(frozen=True)
class ControlVerdict:
    """Whether reruns of one run (without op determinism) ever differed, and why that
    decides the control."""

    passed: bool
    reason: str


def control_verdict(pairs: Sequence[FingerprintPair]) -> ControlVerdict:
    """Passed once any pair of runs ended with different fingerprints; failed when every pair
    was identical, since then identical reruns elsewhere prove nothing about the kernels.

    ValueError for no pairs, or a run without a fingerprint (a failed run is no difference).
    """
    if not pairs:
        raise ValueError("the control ran no pair of runs")
    missing = [i for i, pair in enumerate(pairs) if None in pair]
    if missing:
        raise ValueError(f"pair(s) {missing} have a run without a final fingerprint")
    differing = [i for i, (a, b) in enumerate(pairs) if a != b]
    if differing:
        return ControlVerdict(
            True, f"pair {differing[0] + 1} of {len(pairs)} ended with different fingerprints"
        )
    return ControlVerdict(
        False,
        f"all {len(pairs)} pair(s) of runs without op determinism ended bitwise identical "
        f"({pairs[0][0]}): nondeterministic kernels never showed, so the suite's identical "
        "reruns do not show that op determinism made them deterministic",
    )


def run_until_differ(run_pair: Callable[[int], FingerprintPair], *, tries: int) -> ControlVerdict:
    """Run pairs (`run_pair(i)` for i = 0, 1, ...) until one differs or `tries` have run; the
    verdict on the pairs run."""
    if tries < 1:
        raise ValueError(f"tries must be at least 1, got {tries}")
    pairs: list[FingerprintPair] = []
    for i in range(tries):
        pair = run_pair(i)
        pairs.append(pair)
        if None in pair or pair[0] != pair[1]:
            break
    return control_verdict(pairs)
