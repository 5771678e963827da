"""Run one job in this process: `python -m worker.run --spec S --out R`.

Options: `--checkpoint-dir D` keeps epoch checkpoints (and step checkpoints when the spec
sets `training.checkpoint_every_steps`); `--resume` continues from the newest of either.
`--no-logical-devices` refuses to split the CPU into logical devices for replicas.
Traces and fingerprints do not depend on `--classic-loop` (a dataset per epoch and
TensorFlow reseeded every epoch, as jobs ran before); several steps per compiled call are
the spec's `training.steps_per_execution`.
`--dataset-file F` is the stored dataset the spec names by digest (`dataset.data`): the
file's digest must equal it; `--model-file F` likewise the Keras model definition the spec
names (`model.definition`). `--export-model M.keras` saves the final model on success.

The process re-executes itself once if its environment lacks what determinism needs
(PYTHONHASHSEED and thread variables only count at interpreter start): a worker's executors
start it with that environment, so only a job run by hand pays for a second start. A result
document is always written, also when the spec is invalid or training raises.
SIGTERM asks the job to stop: with `--checkpoint-dir` after the optimizer steps running
then, with a step checkpoint there (a grace period need not last an epoch), else at the end
of the epoch; it writes an `interrupted` result (a second SIGTERM ends it at once).
Exit codes: 0 succeeded, 1 training failed, 2 invalid spec or arguments, 3 interrupted.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import logging
import os
import shutil
import signal
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from worker.errors import ArchitectureError, SpecError
from worker.models.model_size import check_parameter_limit
from worker.record.environment_capture import EXPORT_MODEL_ENV
from worker.result import DataFingerprint, JobError, JobResult, first_result, write_result
from worker.spec import ExperimentSpec, ScriptExperimentSpec, load_spec
from worker.training.cluster import DEFAULT_JOIN_SECONDS, ClusterError, JoinDeadline, this_host
from worker.training.options import TrainingOptions
from worker.training.progress import ProgressReporter

if TYPE_CHECKING:  # the loop imports TensorFlow, which a job loads only once its spec is checked
    from worker.training.loop import TrainingOutcome

_REEXEC_MARK = "REPRO_JOB_REEXEC"
_STARTED = time.monotonic()
EXIT_CODES = {"succeeded": 0, "failed": 1, "invalid": 2, "interrupted": 3}


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m worker.run", description="Run one training job.")
    _run_arguments(p)
    _input_arguments(p)
    _option_arguments(p)
    return p


def _run_arguments(p: argparse.ArgumentParser) -> None:
    """What to run, where its result and checkpoints go, and which stretch of it."""
    p.add_argument("--spec", required=True, type=Path, help="experiment spec (YAML or JSON)")
    p.add_argument("--out", required=True, type=Path, help="where to write the result JSON")
    p.add_argument("--checkpoint-dir", type=Path, help="directory for epoch checkpoints")
    p.add_argument(
        "--resume",
        action="store_true",
        help="continue from the newest intact checkpoint in --checkpoint-dir",
    )
    p.add_argument(
        "--stop-after-epoch",
        type=int,
        metavar="K",
        help="checkpoint after epoch K and stop with status 'interrupted'",
    )
    p.add_argument(
        "--trace-every-steps",
        type=int,
        metavar="N",
        help="fingerprint every N steps, whatever the spec says (the spec hash is unchanged)",
    )
    p.add_argument(
        "--until-epoch",
        type=int,
        metavar="E",
        help="finish after epoch E: with --resume and --trace-every-steps, re-traces one stretch",
    )
    p.add_argument(
        "--until-step",
        type=int,
        metavar="S",
        help="finish after global step S, mid-epoch: with --resume, replays one stretch",
    )


def _input_arguments(p: argparse.ArgumentParser) -> None:
    """The stored inputs the spec names by digest, and where the final model goes."""
    p.add_argument(
        "--dataset-file",
        type=Path,
        metavar="F",
        help="the dataset file whose digest the spec names in dataset.data",
    )
    p.add_argument(
        "--model-file",
        type=Path,
        metavar="F",
        help="the Keras model definition whose digest the spec names in model.definition",
    )
    p.add_argument(
        "--code-file",
        type=Path,
        metavar="W.whl",
        help="the code bundle (wheel) whose digest the spec names in code",
    )
    p.add_argument(
        "--export-model",
        type=Path,
        metavar="M.keras",
        help="on success, save the final model here in Keras's native format "
        f"(default: ${EXPORT_MODEL_ENV}, if set)",
    )


def _option_arguments(p: argparse.ArgumentParser) -> None:
    """How the job trains, and the operator's limits."""
    p.add_argument(
        "--classic-loop",
        action="store_true",
        help="a dataset per epoch and TensorFlow reseeded every epoch, "
        "as jobs once ran: slower, bitwise the same",
    )
    p.add_argument(
        "--no-logical-devices",
        action="store_true",
        help="without GPUs, fail a spec with replicas > 1 instead of using logical CPU devices",
    )
    p.add_argument(
        "--max-model-parameters",
        type=int,
        metavar="N",
        help="fail the job if the model has more parameters (an operator's limit)",
    )
    p.add_argument(
        "--join-timeout",
        type=float,
        metavar="SECONDS",
        default=DEFAULT_JOIN_SECONDS,
        help="a host of a multi-host run (TF_CONFIG) fails if its cluster has not formed "
        f"within this many seconds (default {DEFAULT_JOIN_SECONDS:g})",
    )
    p.add_argument(
        "--max-activation-elements",
        type=int,
        metavar="N",
        help="fail the job if a model definition's largest tensor for one batch holds more "
        "values (an operator's limit)",
    )


def _reexec_if_needed(spec: ExperimentSpec, argv: list[str]) -> None:
    from worker.training.determinism import environment_mismatch, required_environment

    if not environment_mismatch(spec.determinism) or os.environ.get(_REEXEC_MARK):
        return  # a second mismatch is reported by determinism.apply as an error
    env = {**os.environ, **required_environment(spec.determinism), _REEXEC_MARK: "1"}
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, [sys.executable, "-m", "worker.run", *argv], env)


def _open_dataset(
    spec: ExperimentSpec, dataset_file: Path | None
) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    """(arrays, provenance record) of the spec's dataset after checking the file is it."""
    from worker.data.dataset_format import (
        DatasetFormatError,
        file_digest,
        inspect_dataset,
        open_arrays,
    )

    wanted = spec.dataset.data
    if wanted is None and dataset_file is None:
        return None, None

    def refuse(msg: str) -> SpecError:
        return SpecError(f"dataset.data: {msg}", errors=[{"loc": "dataset.data", "msg": msg}])

    if wanted is None:
        raise refuse("a dataset file was given but the spec names no dataset by digest")
    if dataset_file is None:
        raise refuse(f"the spec trains on dataset {wanted} but the job was given no file")
    digest = file_digest(dataset_file)
    if digest != wanted:
        raise refuse(f"{dataset_file.name} has digest {digest}, not the spec's {wanted}")
    try:
        info = inspect_dataset(dataset_file)
        arrays = open_arrays(dataset_file)
    except DatasetFormatError as exc:
        raise refuse(str(exc)) from None
    return arrays, {"digest": digest, **info.as_record()}


def _open_model(
    spec: ExperimentSpec,
    model_file: Path | None,
    *,
    max_parameters: int | None,
    max_activations: int | None = None,
) -> tuple[bytes | None, dict[str, Any] | None]:
    """(bytes, provenance record) of the spec's model definition after checking the file is
    it, that it passes the allow-list and that its parameters are within the limit."""
    from worker.models import keras_definition as kd

    wanted = spec.model.definition
    if wanted is None and model_file is None:
        return None, None

    def refuse(msg: str) -> SpecError:
        return SpecError(
            f"model.definition: {msg}", errors=[{"loc": "model.definition", "msg": msg}]
        )

    if wanted is None:
        raise refuse("a model definition file was given but the spec names none by digest")
    if model_file is None:
        raise refuse(f"the spec trains model definition {wanted} but the job was given no file")
    data = model_file.read_bytes()
    if kd.digest_of(data) != wanted:
        raise refuse(f"{model_file.name} has digest {kd.digest_of(data)}, not the spec's {wanted}")
    try:
        info = kd.read_definition(data)
    except kd.DefinitionRefused as exc:
        raise refuse(str(exc)) from None
    if max_parameters is not None:
        # Before TensorFlow is imported, let alone a weight allocated.
        check_parameter_limit(info.parameter_count, max_parameters, how="counted from its config")
    if max_activations is not None:
        try:  # the sizes the definition fixes; the data's shape fills the rest in the build
            kd.check_activations(info, batch_size=spec.dataset.batch_size, limit=max_activations)
        except kd.DefinitionRefused as exc:
            raise ArchitectureError(f"model definition refused: {exc}") from None
    record = {
        "digest": wanted,
        "format": info.format,
        "parameter_count": info.parameter_count,
        # By path, so a comparison names the layers whose config differs.
        "layers": {
            layer.path: {
                "class_name": layer.class_name,
                "parameters": layer.parameters,
                "config_sha256": layer.config_sha256,
            }
            for layer in info.layers
        },
    }
    return data, record


def _install_code(spec: ExperimentSpec, code_file: Path | None) -> dict[str, Any] | None:
    """Install the spec's code bundle for this job only; its provenance record, or None."""
    wanted = spec.code
    if wanted is None and code_file is None:
        return None

    def refuse(msg: str) -> SpecError:
        return SpecError(f"code: {msg}", errors=[{"loc": "code", "msg": msg}])

    if wanted is None:
        raise refuse("a code bundle was given but the spec names none")
    if code_file is None:
        raise refuse(f"the spec runs code bundle {wanted} but the job was given no file")
    from worker.models import code_bundles

    # A private directory that lives as long as this job: the bundle is visible to no other.
    target = Path(tempfile.mkdtemp(prefix="repro-code-"))
    atexit.register(shutil.rmtree, target, True)
    try:
        info = code_bundles.install(code_file, target, digest=wanted)
    except code_bundles.CodeBundleError as exc:
        raise refuse(str(exc)) from None
    code_bundles.load_entry_points(info, digest=wanted)
    from worker.models import registry

    registry.components.cache_clear()  # its entry points are visible from now on
    return {
        "digest": wanted,
        "name": info.name,
        "version": info.version,
        "entry_points": info.entry_points,
        "files": info.manifest(),
    }


def _failure(
    exc: BaseException, result: JobResult, phase: Literal["spec", "training"] | None = None
) -> JobResult:
    result.status = "failed"
    result.error = JobError(
        type=type(exc).__name__,
        message=str(exc),
        phase=phase or ("spec" if isinstance(exc, SpecError) else "training"),
        traceback=traceback.format_exc(),
        errors=exc.errors if isinstance(exc, SpecError) else [],
    )
    return result


class StopRequest:
    """Remembers SIGTERM (or a fixed epoch) so training stops at the next step it can
    checkpoint (`now`), or at the next epoch end (a fixed epoch, or no checkpoints)."""

    def __init__(self, after_epoch: int | None = None) -> None:
        self.after_epoch = after_epoch
        self.signalled = False

    def install(self) -> None:
        """Handle SIGTERM in this process."""
        signal.signal(signal.SIGTERM, self._on_sigterm)

    def _on_sigterm(self, signum: int, frame: object) -> None:
        self.signalled = True
        signal.signal(signal.SIGTERM, signal.SIG_DFL)  # a second SIGTERM ends the job now

    def __call__(self, epoch: int) -> bool:
        return self.signalled or (self.after_epoch is not None and epoch >= self.after_epoch)

    def now(self) -> bool:
        """Whether SIGTERM asked the job to stop after the steps running now."""
        return self.signalled


def run_job(
    spec: ExperimentSpec,
    *,
    options: TrainingOptions,
    reporter: ProgressReporter,
    dataset_file: Path | None = None,
    export_model: Path | None = None,
    code_file: Path | None = None,
    model_file: Path | None = None,
) -> JobResult:
    """Train `spec` in this process and return its result document (never raises)."""
    resolved, result = first_result(spec)
    assert resolved.seed is not None
    seed = resolved.seed
    try:
        code_record = _install_code(resolved, code_file)
        from worker.models import registry

        registry.check_spec(resolved)
        if options.max_model_parameters is not None:
            # A built-in model's size is arithmetic on the spec: refuse an oversized one
            # before TensorFlow is even imported, let alone a weight allocated.
            parameters = registry.parameter_count(resolved)
            if parameters is not None:
                check_parameter_limit(
                    parameters, options.max_model_parameters, how="computed from the spec"
                )
        arrays, dataset_record = _open_dataset(resolved, dataset_file)
        definition, model_record = _open_model(
            resolved,
            model_file,
            max_parameters=options.max_model_parameters,
            max_activations=options.max_activation_elements,
        )

        from worker.record.provenance import capture_provenance
        from worker.training.loop import run_training

        reporter.emit("started", spec_hash=result.spec_hash, seed=list(seed))
        startup = time.monotonic() - _STARTED
        outcome = run_training(
            resolved,
            seed=seed,
            reporter=reporter,
            options=options,
            data=arrays,
            model_definition=definition,
        )
        result.provenance = capture_provenance(
            spec_hash=resolved.spec_hash(), seed=seed, determinism=outcome.determinism
        )
        if dataset_record is not None:
            result.provenance["dataset"] = dataset_record
        if code_record is not None:
            result.provenance["code"] = code_record
        if model_record is not None:
            result.provenance["model_definition"] = model_record
        _record_outcome(result, outcome, spec=resolved, options=options, startup=startup)
        interrupted = outcome.interrupted
        if export_model is not None and not interrupted and outcome.model is not None:
            t_export = time.monotonic()
            export_model.parent.mkdir(parents=True, exist_ok=True)
            outcome.model.save(export_model)
            result.timings["export_model"] = round(time.monotonic() - t_export, 6)
        result.status = "interrupted" if interrupted else "succeeded"
    except Exception as exc:  # the job's error goes into its result; the process survives
        _failure(exc, result)
    return result


def _record_outcome(
    result: JobResult,
    outcome: TrainingOutcome,
    *,
    spec: ExperimentSpec,
    options: TrainingOptions,
    startup: float,
) -> None:
    """Copy what training found (trace, metrics, checkpoints, ...) into the result document."""
    every = options.trace_every_steps or spec.training.fingerprint_every_steps
    interrupted = outcome.interrupted
    result.determinism = outcome.determinism
    result.metrics = outcome.metrics
    result.step_metrics = outcome.step_metrics
    result.trace = outcome.trace
    result.trace_granularity = f"steps:{every}" if every else "epoch"
    result.final_fingerprint = None if interrupted else outcome.trace[-1].fingerprint
    result.data_fingerprints = [DataFingerprint(**d) for d in outcome.data_fingerprints]
    result.eval_data_fingerprint = outcome.eval_data_fingerprint
    if options.checkpoint_dir is not None:
        result.checkpoints = [str(options.checkpoint_dir / c) for c in outcome.checkpoints]
    result.resumed_from_epoch = outcome.resumed_from_epoch
    result.resumed_from_step = outcome.resumed_from_step
    result.interrupted_after_epoch = outcome.interrupted_after_epoch
    result.interrupted_at_step = outcome.interrupted_at_step
    until_epoch = options.until_epoch
    result.until_epoch = until_epoch if until_epoch and until_epoch < spec.training.epochs else None
    result.until_step = outcome.stopped_at_step
    result.warnings = outcome.warnings
    result.timings = {"startup": round(startup, 6), **outcome.timings}


def _exit_code(result: JobResult) -> int:
    if result.error is not None and result.error.phase == "spec":
        return EXIT_CODES["invalid"]
    return EXIT_CODES[result.status]


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the process exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args = _parser().parse_args(argv)
    reporter = ProgressReporter()
    try:
        if args.resume and args.checkpoint_dir is None:
            raise SpecError("--resume needs --checkpoint-dir")
        if args.export_model is None and os.environ.get(EXPORT_MODEL_ENV):
            args.export_model = Path(os.environ[EXPORT_MODEL_ENV])
        if args.export_model is not None and args.export_model.suffix != ".keras":
            raise SpecError(f"--export-model must end in .keras, got {args.export_model.name}")
        if not args.join_timeout > 0:
            raise SpecError(f"--join-timeout must be positive, got {args.join_timeout}")
        for option in ("trace_every_steps", "until_epoch", "until_step", "stop_after_epoch"):
            value = getattr(args, option)
            if value is not None and value < 1:
                raise SpecError(f"--{option.replace('_', '-')} must be at least 1, got {value}")
        spec = load_spec(args.spec)
    except (SpecError, OSError) as exc:
        result = _failure(exc, JobResult(status="failed"), phase="spec")
    else:
        if isinstance(spec, ScriptExperimentSpec):
            result = _script_job(spec, args, reporter)
        else:
            result = _spec_job(spec, args, argv, reporter)
    write_result(result, args.out)
    reporter.emit(
        "finished",
        status=result.status,
        fingerprint=result.final_fingerprint,
        error=result.error.message if result.error else None,
    )
    return _exit_code(result)


def _script_job(
    spec: ScriptExperimentSpec, args: argparse.Namespace, reporter: ProgressReporter
) -> JobResult:
    """A script experiment's job: only the arguments a script run takes. A script saves its
    own model, if it wants one: `--export-model` is not for it and is left alone."""
    from worker.script.job import run_script_job

    unsupported = [
        f"--{name.replace('_', '-')}"
        for name in (
            "stop_after_epoch",
            "until_step",
            "dataset_file",
            "model_file",
        )
        if getattr(args, name)
    ]
    if unsupported:
        msg = f"a script experiment's job does not take {', '.join(unsupported)}"
        return _failure(SpecError(msg), JobResult(status="failed"), phase="spec")
    return run_script_job(
        spec,
        reporter=reporter,
        code_file=args.code_file,
        checkpoint_dir=args.checkpoint_dir,
        resume=args.resume,
        until_epoch=args.until_epoch,
        trace_every_steps=args.trace_every_steps,
    )


def _spec_job(
    spec: ExperimentSpec, args: argparse.Namespace, argv: list[str], reporter: ProgressReporter
) -> JobResult:
    """A training spec's job, in this process."""
    _reexec_if_needed(spec, argv)
    stop = StopRequest(args.stop_after_epoch)
    stop.install()
    try:
        host = this_host(spec.distribution.hosts)
    except ClusterError as exc:
        return _failure(exc, first_result(spec)[1], phase="spec")

    def provisional(message: str) -> Path:
        result = first_result(spec)[1]
        result.status = "failed"
        result.error = JobError(type="ClusterError", message=message, phase="training")
        write_result(result, args.out)
        return Path(args.out)

    deadline = JoinDeadline(args.join_timeout, host, provisional)
    deadline.start()
    options = TrainingOptions(
        checkpoint_dir=args.checkpoint_dir,
        resume=args.resume,
        stop_requested=stop,
        stop_now=stop.now,
        max_model_parameters=args.max_model_parameters,
        max_activation_elements=args.max_activation_elements,
        trace_every_steps=args.trace_every_steps,
        until_epoch=args.until_epoch,
        until_step=args.until_step,
        allow_logical_devices=not args.no_logical_devices,
        classic=args.classic_loop,
        joined=deadline.joined,
    )
    return run_job(
        spec,
        options=options,
        reporter=reporter,
        dataset_file=args.dataset_file,
        export_model=args.export_model,
        code_file=args.code_file,
        model_file=args.model_file,
    )


def exit_now(code: int) -> None:
    """End the job's process with `code` once its result and output are out, skipping the
    interpreter's teardown of TensorFlow and every module (about 0.7 s a job on 2 cores,
    waited for by whoever collects the result). Exit handlers still run."""
    atexit._run_exitfuncs()  # what finalization would run first (a bundle's directory, ...)
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # a closed pipe: nothing more to say
            stream.flush()
    os._exit(code)


if __name__ == "__main__":
    exit_now(main())
