"""Run one job in this process: `python -m worker.run --spec S --out R`.

Options: `--checkpoint-dir D` keeps epoch checkpoints; `--resume` continues from the newest.

The process re-executes itself once if its environment lacks what determinism needs
(PYTHONHASHSEED and thread variables only count at interpreter start). A result
document is always written, also when the spec is invalid or training raises.
Exit codes: 0 succeeded, 1 training failed, 2 invalid spec or arguments.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import traceback
from pathlib import Path

from worker.errors import ReproError, SpecError
from worker.progress import ProgressReporter
from worker.result import DataFingerprint, JobError, JobResult, write_result
from worker.seeds import resolve_seed
from worker.spec import ExperimentSpec, load_spec

_REEXEC_MARK = "REPRO_JOB_REEXEC"
_STARTED = time.monotonic()


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m worker.run", description=__doc__.split("\n")[0])
    p.add_argument("--spec", required=True, type=Path, help="experiment spec (YAML or JSON)")
    p.add_argument("--out", required=True, type=Path, help="where to write the result JSON")
    p.add_argument("--checkpoint-dir", type=Path, help="directory for epoch checkpoints")
    p.add_argument(
        "--resume",
        action="store_true",
        help="continue from the newest intact checkpoint in --checkpoint-dir",
    )
    return p


def _reexec_if_needed(spec: ExperimentSpec, argv: list[str]) -> None:
    from worker.determinism import environment_mismatch, required_environment

    if not environment_mismatch(spec.determinism) or os.environ.get(_REEXEC_MARK):
        return  # a second mismatch is reported by determinism.apply as an error
    env = {**os.environ, **required_environment(spec.determinism), _REEXEC_MARK: "1"}
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, [sys.executable, "-m", "worker.run", *argv], env)


def _failure(exc: BaseException, result: JobResult) -> JobResult:
    errors = exc.errors if isinstance(exc, SpecError) else []
    result.status = "failed"
    result.error = JobError(
        type=type(exc).__name__,
        message=str(exc),
        phase="spec" if isinstance(exc, SpecError) else "training",
        traceback=traceback.format_exc(),
        errors=errors,
    )
    return result


def run_job(
    spec: ExperimentSpec, *, checkpoint_dir: Path | None, resume: bool, reporter: ProgressReporter
) -> JobResult:
    """Train `spec` in this process and return its result document (never raises)."""
    seed = resolve_seed(spec.seed)
    resolved = spec.with_seed(seed)
    result = JobResult(
        status="failed",
        spec_hash=resolved.spec_hash(),
        seed=list(seed),
        seed_source="spec" if spec.seed is not None else "generated",
        spec=resolved.model_dump(mode="json"),
    )
    try:
        from worker import registry
        from worker.provenance import capture_provenance
        from worker.training import run_training

        registry.check_spec(resolved)
        reporter.emit("started", spec_hash=result.spec_hash, seed=list(seed))
        startup = time.monotonic() - _STARTED
        outcome = run_training(
            resolved, seed=seed, checkpoint_dir=checkpoint_dir, resume=resume, reporter=reporter
        )
        result.provenance = capture_provenance(
            spec_hash=resolved.spec_hash(), seed=seed, determinism=outcome.determinism
        )
        result.determinism = outcome.determinism
        result.metrics = outcome.metrics
        result.trace = outcome.trace
        every = resolved.training.fingerprint_every_steps
        result.trace_granularity = f"steps:{every}" if every else "epoch"
        result.final_fingerprint = outcome.trace[-1].fingerprint
        result.data_fingerprints = [DataFingerprint(**d) for d in outcome.data_fingerprints]
        result.eval_data_fingerprint = outcome.eval_data_fingerprint
        result.checkpoints = (
            [str(checkpoint_dir / c) for c in outcome.checkpoints] if checkpoint_dir else []
        )
        result.resumed_from_epoch = outcome.resumed_from_epoch
        result.warnings = outcome.warnings
        result.timings = {"startup": round(startup, 6), **outcome.timings}
        result.status = "succeeded"
    except Exception as exc:  # the job's error goes into its result; the process survives
        _failure(exc, result)
    return result


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the process exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args = _parser().parse_args(argv)
    reporter = ProgressReporter()
    try:
        spec = load_spec(args.spec)
    except (SpecError, OSError) as exc:
        write_result(_failure(exc, JobResult(status="failed")), args.out)
        reporter.emit("finished", status="failed", error=str(exc))
        return 2
    if args.resume and args.checkpoint_dir is None:
        exc = ReproError("--resume needs --checkpoint-dir")
        write_result(_failure(exc, JobResult(status="failed")), args.out)
        return 2
    _reexec_if_needed(spec, argv)
    result = run_job(
        spec, checkpoint_dir=args.checkpoint_dir, resume=args.resume, reporter=reporter
    )
    write_result(result, args.out)
    reporter.emit(
        "finished",
        status=result.status,
        fingerprint=result.final_fingerprint,
        error=result.error.message if result.error else None,
    )
    if result.error is not None and result.error.phase == "spec":
        return 2
    return 0 if result.status == "succeeded" else 1


if __name__ == "__main__":
    sys.exit(main())
