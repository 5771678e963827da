"""A script experiment's job: the user's own script, run in a fresh interpreter, its record
turned into the result document every run has.

The script's directory arrives as a code bundle (a wheel whose files are the directory's).
It is unpacked into a private directory, and `python ENTRY ARGS` runs there with the run's
identity in its environment: the seed (`reprotrain.init()` takes it instead of its own),
the spec hash, the determinism settings, where to keep the record, and where to write
epoch checkpoints. The script's progress lines go straight to the agent (the same stderr);
what it prints on stdout goes to stderr too, so it lands in the job's log.

SIGTERM is passed on to the script, which ends with it; the result then says `interrupted`.
TensorFlow-free: the script imports it, not this process.
"""

from __future__ import annotations

import atexit
import json
import math
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from worker.errors import SpecError
from worker.record.trace import TracePoint
from worker.result import DataFingerprint, JobError, JobResult, first_result, step_bucket_size
from worker.script.run import (
    CHECKPOINT_DIR_ENV,
    DETERMINISM_ENV,
    PRE_SEEDED_ENV,
    PROGRESS_ENV,
    RESUME_ENV,
    RUNS_DIR_ENV,
    SEED_ENV,
    SPEC_HASH_ENV,
    TRACE_EVERY_ENV,
    UNTIL_EPOCH_ENV,
)
from worker.spec import ScriptExperimentSpec, parse_any_spec
from worker.training.determinism import required_environment
from worker.training.progress import ProgressReporter

_TAIL_LINES = 20


# Runs the script as `python SCRIPT ARGS` would, after seeding Python's and NumPy's global
# generators from the run's seed: what the script draws before `reprotrain.init()` (a split,
# a shuffle) is then the same on every run of it. argv: the two seed words, script, args.
BOOTSTRAP = """
import os, random, runpy, sys
from worker.training.seeds import derive_int_seed
before_init = derive_int_seed((int(sys.argv[1]), int(sys.argv[2])), "before-init")
sys.argv = sys.argv[3:]
sys.path[0] = os.path.dirname(os.path.abspath(sys.argv[0]))
random.seed(before_init)
try:
    import numpy
except ImportError:
    pass
else:
    numpy.random.seed(before_init)
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def seed_words(seed: tuple[int, int]) -> list[str]:
    """The seed as the bootstrap's first two arguments."""
    return [str(seed[0]), str(seed[1])]


def _refuse(msg: str, loc: str = "code") -> SpecError:
    return SpecError(f"{loc}: {msg}", errors=[{"loc": loc, "msg": msg}])


def install_directory(spec: ScriptExperimentSpec, code_file: Path | None) -> tuple[Path, Any]:
    """The script's directory unpacked for this job only, and its bundle's record."""
    from worker.models import code_bundles

    if code_file is None:
        raise _refuse(f"the spec runs the script directory {spec.code} but the job was given none")
    target = Path(tempfile.mkdtemp(prefix="repro-script-"))
    atexit.register(shutil.rmtree, target, True)
    try:
        info = code_bundles.install(code_file, target, digest=spec.code)
    except code_bundles.CodeBundleError as exc:
        raise _refuse(str(exc)) from None
    if spec.script.entry not in info.manifest():
        raise _refuse(f"the script's directory holds no {spec.script.entry}", "script.entry")
    record = {
        "digest": spec.code,
        "name": info.name,
        "version": info.version,
        "entry_points": info.entry_points,
        "files": info.manifest(),
    }
    return target, record


def script_environment(
    spec: ScriptExperimentSpec,
    *,
    seed: tuple[int, int],
    runs_dir: Path,
    checkpoint_dir: Path | None,
) -> dict[str, str]:
    """The environment the script starts with: this job's, plus the run's identity and what
    determinism needs at interpreter start (so `init()` need not start it again)."""
    env = {
        **os.environ,
        **required_environment(spec.determinism),
        SEED_ENV: f"{seed[0]},{seed[1]}",
        SPEC_HASH_ENV: spec.with_seed(seed).spec_hash(),
        DETERMINISM_ENV: spec.determinism.model_dump_json(),
        RUNS_DIR_ENV: str(runs_dir),
        PROGRESS_ENV: "1",
    }
    if checkpoint_dir is not None:
        env[CHECKPOINT_DIR_ENV] = str(checkpoint_dir)
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    return env


def run_script_job(
    spec: ScriptExperimentSpec,
    *,
    reporter: ProgressReporter,
    code_file: Path | None,
    checkpoint_dir: Path | None = None,
    resume: bool = False,
    until_epoch: int | None = None,
    trace_every_steps: int | None = None,
) -> JobResult:
    """Run the spec's script to its end and return its result document (never raises).
    With `resume`, the script's `init()` continues from the newest checkpoint of the spec
    in `checkpoint_dir` (the Keras callback restores it; a custom loop calls `run.restore`).
    `until_epoch` ends it after that epoch (a replay of a stretch); `trace_every_steps` has
    the Keras callback trace every N steps (a custom loop traces where it does)."""
    resolved, result = first_result(spec)
    assert resolved.seed is not None
    seed = resolved.seed
    started = time.monotonic()
    try:
        directory, code_record = install_directory(resolved, code_file)
        runs_dir = Path(tempfile.mkdtemp(prefix="repro-script-runs-"))
        atexit.register(shutil.rmtree, runs_dir, True)
        if checkpoint_dir is not None:
            checkpoint_dir.mkdir(parents=True, exist_ok=True)
        env = script_environment(
            resolved, seed=seed, runs_dir=runs_dir, checkpoint_dir=checkpoint_dir
        )
        if resume:
            env[RESUME_ENV] = "1"
        if until_epoch is not None:
            env[UNTIL_EPOCH_ENV] = str(until_epoch)
        if trace_every_steps is not None:
            env[TRACE_EVERY_ENV] = str(trace_every_steps)
        reporter.emit("started", spec_hash=result.spec_hash, seed=list(seed))
        env[PRE_SEEDED_ENV] = "1"
        command = [sys.executable, "-c", BOOTSTRAP, *seed_words(seed)]
        code, signalled = _run(
            [*command, resolved.script.entry, *resolved.script.args], directory, env
        )
        _take_record(result, _the_record(runs_dir), code=code, signalled=signalled)
        result.provenance["code"] = code_record
        result.provenance["script"] = resolved.script.model_dump(mode="json")
    except SpecError as exc:
        result.error = JobError(
            type=type(exc).__name__, message=str(exc), phase="spec", errors=exc.errors
        )
    except Exception as exc:  # the job's error goes into its result; the process survives
        result.error = JobError(type=type(exc).__name__, message=str(exc))
    result.timings["script"] = round(time.monotonic() - started, 6)
    if checkpoint_dir is not None:
        result.checkpoints = [str(checkpoint_dir / c) for c in result.checkpoints]
    return result


def by_hand_result(
    spec: dict[str, Any], record: dict[str, Any], *, code: dict[str, Any]
) -> JobResult:
    """The result document of a script run by hand, from its record: what a worker's job
    would report of the same run, marked as run by hand on this machine (no image)."""
    parsed = parse_any_spec(spec)
    if not isinstance(parsed, ScriptExperimentSpec):
        raise TypeError("a run by hand is a script experiment")
    resolved, result = first_result(parsed)
    try:
        _take_record(result, record, code=0, signalled=False)
    except RuntimeError as exc:
        result.error = JobError(type="ScriptFailed", message=str(exc))
    result.provenance["code"] = code
    result.provenance["script"] = resolved.script.model_dump(mode="json")
    result.provenance["execution"] = {"by_hand": True, "host": platform.node() or None}
    result.checkpoints = []  # on this machine only: nothing the service could read
    return result


def _run(cmd: list[str], cwd: Path, env: dict[str, str]) -> tuple[int, bool]:
    """Run the script; (exit code, whether this job was asked to stop). SIGTERM is passed on."""
    proc = subprocess.Popen(
        cmd, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=sys.stderr.fileno()
    )
    signalled = False

    def forward(signum: int, frame: object) -> None:
        nonlocal signalled
        signalled = True
        proc.send_signal(signum)

    previous = signal.signal(signal.SIGTERM, forward)
    try:
        code = proc.wait()
    finally:
        signal.signal(signal.SIGTERM, previous)
    return code, signalled


def _the_record(runs_dir: Path) -> dict[str, Any] | None:
    records = sorted(runs_dir.glob("*/run.json"))
    if len(records) > 1:
        raise RuntimeError(
            f"the script started {len(records)} runs (reprotrain.init() after run.finish()); "
            "a script experiment is one run: call init() once"
        )
    if not records:
        return None
    data: dict[str, Any] = json.loads(records[0].read_text())
    return data


def _ended_by(error: Any, code: int) -> str:
    """Why the script failed, in one line: the exception that ended it, if it recorded one,
    with what to do about a package its environment lacks."""
    if not isinstance(error, dict) or not error.get("type"):
        return f"the script exited with code {code}: see the job's log"
    said = f"the script raised {error['type']}: {error.get('message', '')}"
    if error["type"] == "ModuleNotFoundError":
        said += (
            " (the worker's environment lacks it: in a container, build a derived worker "
            "image with it, docker/build.sh user --requirements FILE, and pin the run to it)"
        )
    return said


def _take_record(
    result: JobResult, record: dict[str, Any] | None, *, code: int, signalled: bool
) -> None:
    """Copy the script's record into the result, and judge how the script ended."""
    if record is None and code != 0 and not signalled:
        raise RuntimeError(
            f"the script exited with code {code} before reprotrain.init() recorded anything "
            "(an error at its top, before init?): see the job's log"
        )
    if record is None:
        how = f"exited with code {code}" if code else "ended"
        raise RuntimeError(
            f"the script {how} without calling reprotrain.init(): add `import reprotrain` "
            "and `run = reprotrain.init()` at its top, and record its training with "
            "run.keras_callback() or run.trace_point(...)"
        )
    trace = [TracePoint.model_validate(p) for p in record.get("trace") or []]
    result.trace = trace
    result.trace_granularity = record.get("trace_granularity") or "epoch"
    result.data_fingerprints = [
        DataFingerprint.model_validate(d) for d in record.get("data_fingerprints") or []
    ]
    result.metrics = epoch_rows(record.get("metrics") or [])
    result.step_metrics = step_rows(record.get("metrics") or [])
    result.determinism = record.get("determinism") or {}
    result.provenance = dict(record.get("provenance") or {})
    result.provenance["script_run"] = {
        k: record.get(k) for k in ("project", "name", "params", "tags", "artifacts")
    }
    result.warnings = list(record.get("warnings") or [])
    result.checkpoints = list(record.get("checkpoints") or [])
    result.resumed_from_epoch = record.get("resumed_from_epoch")
    result.until_epoch = record.get("stopped_at_epoch")
    epochs = [p.epoch for p in trace if p.kind == "epoch"]
    if signalled:
        result.status = "interrupted"
        result.interrupted_after_epoch = max(epochs) if epochs else None
        return
    if code != 0:
        raise RuntimeError(_ended_by(record.get("error"), code))
    if record.get("status") == "failed":
        raise RuntimeError("the script failed: an uncaught exception ended it")
    if not trace or trace[-1].kind != "epoch":
        raise RuntimeError(
            "the script ended without a trace point at the end of an epoch: use "
            "run.keras_callback() with model.fit, or call run.trace_point(step=..., "
            "epoch=..., model=..., optimizer=...) after each epoch of a custom loop"
        )
    result.final_fingerprint = trace[-1].fingerprint
    result.status = "succeeded"


def epoch_rows(metrics: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The script's logged metrics as a run's rows: one per epoch (its last value of each
    metric logged with that epoch); metrics logged without an epoch stay in the record."""
    rows: dict[int, dict[str, Any]] = {}
    for m in metrics:
        epoch = m.get("epoch")
        if not isinstance(epoch, int):
            continue
        row = rows.setdefault(epoch, {"epoch": epoch})
        row["step"] = m.get("step")
        row[str(m.get("name"))] = m.get("value")
    return [rows[e] for e in sorted(rows)]


def step_rows(metrics: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Metrics the script logged with a step and no epoch (`run.log_metric(name, value,
    step=s)`) as per-step rows, one per step, thinned evenly to at most MAX_STEP_POINTS."""
    rows: dict[int, dict[str, Any]] = {}
    for m in metrics:
        step, value = m.get("step"), m.get("value")
        if m.get("epoch") is not None or not isinstance(step, int) or step < 0:
            continue
        if isinstance(value, int | float) and math.isfinite(value):
            rows.setdefault(step, {"step": step})[str(m.get("name"))] = value
    if not rows:
        return []
    bucket = step_bucket_size(max(rows) + 1)
    kept: list[dict[str, Any]] = []
    for step in sorted(rows):
        if not kept or step // bucket > kept[-1]["step"] // bucket:
            kept.append(rows[step])
    return kept
