"""One run of a user's own training script: its seed, determinism, provenance and record.

The record is `run.json` in the run's directory (`REPRO_SCRIPT_RUNS_DIR`, default
`./reprotrain-runs/<run id>/`), rewritten durably at every trace point, params or tags
change and at the end: the script (path, digest, arguments), params and tags, the seed,
what determinism was set, provenance, the trace (fingerprints of the model, optimizer and
RNG state) and metrics. Metrics also go to `metrics.jsonl` a line each as they are
logged, so a crash loses none of them.
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import json
import os
import random
import secrets
import shutil
import sys
import sysconfig
import threading
import warnings
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from types import ModuleType, TracebackType
from typing import IO, TYPE_CHECKING, Any

from worker.record.trace import PointKind, TracePoint
from worker.script.on_import import after_import
from worker.spec import DeterminismSpec
from worker.training.determinism import environment_mismatch, required_environment
from worker.training.progress import ProgressReporter
from worker.training.seeds import SeedTuple, derive_int_seed, resolve_seed, seed_tuple

if TYPE_CHECKING:
    from worker.record.checkpoint import Checkpoint, Syncer
    from worker.record.variable_reads import TrainingState
    from worker.script.data import ConsumedData

RUNS_DIR_ENV = "REPRO_SCRIPT_RUNS_DIR"
# Set by a worker that runs the script as a run's job (worker.script.job):
SEED_ENV = "REPRO_RUN_SEED"  # "A,B": the run's seed, which init() takes over its own
SPEC_HASH_ENV = "REPRO_RUN_SPEC_HASH"  # the run's spec hash, recorded instead of the script's
DETERMINISM_ENV = "REPRO_RUN_DETERMINISM"  # the spec's determinism section, as JSON
CHECKPOINT_DIR_ENV = "REPRO_RUN_CHECKPOINT_DIR"  # where each epoch's checkpoint goes
PROGRESS_ENV = "REPRO_RUN_PROGRESS"  # "1": progress lines on stderr, for the worker
RESUME_ENV = "REPRO_RUN_RESUME"  # "1": continue from the newest checkpoint in the directory
UNTIL_EPOCH_ENV = "REPRO_RUN_UNTIL_EPOCH"  # E: end the run at the end of epoch E (a replay)
TRACE_EVERY_ENV = "REPRO_RUN_TRACE_EVERY_STEPS"  # N: the Keras callback traces every N steps
_RESTARTED = "REPRO_SCRIPT_RESTARTED"  # set on the one restart init() makes
_MAX_NAME = 200


class DeterminismWarning(UserWarning):
    """Something `init()` could not make deterministic; the record says it too."""


_current: ScriptRun | None = None
# Given by the client package (`reprotrain`), which records a run by hand on the service
# the environment names (see `connect_with`); worker code never imports the client.
_connect: Callable[..., Any] | None = None
_startup_warnings: list[str] = []  # what the run's record says it could not set
_lock = threading.Lock()


def init(
    project: str | None = None,
    name: str | None = None,
    *,
    params: Mapping[str, Any] | None = None,
    tags: Mapping[str, str] | None = None,
    seed: int | tuple[int, int] | list[int] | None = None,
    runs_dir: str | os.PathLike[str] | None = None,
) -> ScriptRun:
    """Start recording this script's run and make its training deterministic.

    Call it at the top of the script, before it builds a model or draws a random number.
    The seed is the one the run was started with (a rerun gets the same), else `seed`, else
    a fresh random one (recorded). PYTHONHASHSEED and thread counts only count when the
    interpreter starts: when they are not what determinism needs, the script is started
    again, once, with them set (the same interpreter, arguments and environment), before
    anything else of it has run.
    """
    global _current
    with _lock:
        if _current is not None and not _current.finished:
            raise RuntimeError(
                "reprotrain.init() was called twice in one process; call run.finish() (or "
                "use the run as a context manager) before starting another"
            )
        determinism = os.environ.get(DETERMINISM_ENV)
        spec = (
            DeterminismSpec.model_validate_json(determinism) if determinism else DeterminismSpec()
        )
        # Only a script's own top level may be started again (not a test suite, not a
        # library that calls init for it).
        from_main = sys._getframe(1).f_globals.get("__name__") == "__main__"
        restart_with_determinism_environment(spec, restartable=from_main and _restartable())
        given = os.environ.get(SEED_ENV)
        resolved = seed_tuple([int(p) for p in given.split(",")]) if given else resolve_seed(seed)
        run = ScriptRun(
            project=_name(project, "project") or "default",
            name=_name(name, "name") or Path(sys.argv[0] or "script").stem,
            params=dict(params or {}),
            tags={str(k): str(v) for k, v in (tags or {}).items()},
            seed=resolved,
            runs_dir=Path(runs_dir or os.environ.get(RUNS_DIR_ENV) or "reprotrain-runs"),
            determinism=spec,
        )
        run.start()
        _current = run
        return run


def autolog() -> None:
    """Record every `model.fit` of the run `init()` started: its trace (the callback added
    to each call) and the data it trains on. Call it after `init()`."""
    if _current is None or _current.finished:
        raise RuntimeError("reprotrain.autolog() needs a run: call reprotrain.init() first")
    _current.autolog()


def connect_with(connect: Callable[..., Any] | None) -> None:
    """How `init()` records a run by hand on a service: `connect(script, args, name=...,
    seed=...)` returns None (no service configured) or a link with `run_id`, `url`, `spec`
    (the experiment's, seed resolved), `spec_hash`, `code` (the directory's bundle record) and
    `report(result)`. A worker's job never connects: its worker reports the run."""
    global _connect
    _connect = connect


def current() -> ScriptRun | None:
    """The run `init()` started in this process, while it is not finished."""
    return _current if _current is not None and not _current.finished else None


def _name(value: str | None, what: str) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not value.strip() or len(value) > _MAX_NAME:
        raise ValueError(f"{what} must be a non-empty string of at most {_MAX_NAME} characters")
    return value.strip()


def _restartable() -> bool:
    """Whether the process is a script or module run from the command line (not `-c`, not
    an interactive session or a notebook), which can be started again as it was."""
    argv = getattr(sys, "orig_argv", [])
    if "-c" in argv or not sys.argv or not sys.argv[0]:
        return False
    return "-m" in argv or Path(sys.argv[0]).is_file()


def restart_with_determinism_environment(spec: DeterminismSpec, *, restartable: bool) -> None:
    """Start the script again with the environment `spec` needs, if it lacks it (once)."""
    mismatch = environment_mismatch(spec)
    if not mismatch:
        return
    if os.environ.get(_RESTARTED) or not restartable:
        detail = ", ".join(f"{k}={now!r} (needs {need!r})" for k, (now, need) in mismatch.items())
        _startup_warnings.append(f"not started with {detail}")
        warnings.warn(
            f"reprotrain could not start this process with {detail}: string hashing (set "
            "iteration order) may differ between runs; call init() at the top of a script "
            "run from the command line, or set these variables before Python starts",
            DeterminismWarning,
            stacklevel=3,
        )
        return
    env = {**os.environ, **required_environment(spec), _RESTARTED: "1"}
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, list(sys.orig_argv), env)


def _script_identity() -> dict[str, Any]:
    path = Path(sys.argv[0]) if sys.argv and sys.argv[0] else None
    if path is None or not path.is_file():
        return {"path": None, "sha256": None, "args": sys.argv[1:]}
    return {
        "path": str(path),
        "sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
        "args": sys.argv[1:],
    }


def _json_value(value: Any) -> Any:
    """Params as JSON keeps them: numbers, strings, booleans, None, lists and mappings."""
    return json.loads(json.dumps(value, default=str))


class ScriptRun:
    """The run `reprotrain.init()` started. Log to it; `finish()` (or leave its `with`)."""

    def __init__(
        self,
        *,
        project: str,
        name: str,
        params: dict[str, Any],
        tags: dict[str, str],
        seed: SeedTuple,
        runs_dir: Path,
        determinism: DeterminismSpec,
    ) -> None:
        self.id = f"{datetime.now(UTC):%Y%m%d-%H%M%S}-{secrets.token_hex(3)}"
        self.directory = runs_dir / self.id
        self.seed: SeedTuple = seed
        self.finished = False
        self._spec = determinism
        self._steps = 0
        self._cancel_hooks: list[Callable[[], None]] = []
        self._metrics_file: IO[str] | None = None
        self._state: tuple[tuple[int, int, int, int], TrainingState] | None = None
        self._failed = False
        checkpoints = os.environ.get(CHECKPOINT_DIR_ENV)
        self._checkpoint_dir = Path(checkpoints) if checkpoints else None
        self._progress = ProgressReporter() if os.environ.get(PROGRESS_ENV) == "1" else None
        self._resume: Checkpoint | None = None  # the checkpoint to continue from, until restored
        until = os.environ.get(UNTIL_EPOCH_ENV)
        self._until_epoch = int(until) if until else None
        self._resumed = False
        self._syncer: Syncer | None = None
        self._data: ConsumedData | None = None  # once the script wraps or fits data
        self._autolog = False
        self._pid = os.getpid()  # a forked child writes nothing of the run
        self._warned: set[str] = set()
        self._link: Any = None  # the run on the service, for a run by hand
        self._record: dict[str, Any] = {
            "id": self.id,
            "kind": "script",
            "project": project,
            "name": name,
            "status": "running",
            "started_at": _now(),
            "finished_at": None,
            "script": _script_identity(),
            "params": _json_value(params),
            "tags": tags,
            "seed": list(seed),
            "determinism": None,
            "warnings": list(_startup_warnings),
            "provenance": None,
            "trace": [],
            "data_fingerprints": [],
            "metrics": [],
            "artifacts": [],
            "checkpoints": [],
        }

    # -- start and end -----------------------------------------------------------------------

    def start(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=False)
        if _connect is not None and not os.environ.get(SEED_ENV):
            self._attach(_connect)
        if os.environ.get(RESUME_ENV) == "1" and self._checkpoint_dir is not None:
            self._load_resume_point(self._checkpoint_dir)
        for said in drawn_before_init():
            self._record["warnings"].append(said)
            warnings.warn(said, DeterminismWarning, stacklevel=3)
        # Python's and NumPy's generators now; TensorFlow and Keras as soon as the script
        # has imported TensorFlow (at once if it already has).
        random.seed(derive_int_seed(self.seed, "python"))
        with contextlib.suppress(ImportError):
            import numpy as np

            np.random.seed(derive_int_seed(self.seed, "init"))
        self._cancel_hooks = [
            after_import(name, self._set_up_tensorflow) for name in ("tensorflow", "keras")
        ]
        self._write()
        atexit.register(self._at_exit)
        os.register_at_fork(before=self._forking)
        self._cancel_hooks.append(after_import("numpy", self._watch_numpy))
        previous = sys.excepthook

        def note_failure(*exc_info: Any) -> None:
            self._failed = True
            kind, value = exc_info[0], exc_info[1]
            # What ended the script, for the run's error (its traceback is in the log).
            self._record["error"] = {"type": kind.__name__, "message": str(value)[:2000]}
            previous(*exc_info)

        sys.excepthook = note_failure

    def _attach(self, connect: Callable[..., Any]) -> None:
        """Record this run by hand on the service the environment names (before anything
        records the spec hash, which becomes the service's); a service that cannot record
        it leaves the run recorded on disk only, with a warning."""
        script = self._record["script"]
        if script["path"] is None:
            return
        try:
            link = connect(
                script["path"], script["args"], name=self._record["name"], seed=list(self.seed)
            )
        except Exception as exc:  # the training goes on; its record stays on disk
            self._warn_once(f"the run is recorded on disk only: the service refused it ({exc})")
            return
        if link is None:
            return
        self._link = link
        self._record["server"] = {"run_id": link.run_id, "url": link.url}
        print(f"reprotrain: recording run {link.run_id} at {link.url}", file=sys.stderr)

    def _report(self) -> None:
        """Send the result document of a run by hand to its run on the service."""
        from worker.script.job import by_hand_result

        try:
            result = by_hand_result(self._link.spec, self.record, code=self._link.code)
            self._link.report(result.model_dump(mode="json"))
        except Exception as exc:
            message = f"the result of run {self._link.run_id} was not reported: {exc}"
            self._record["warnings"].append(message)
            self._write()
            warnings.warn(f"{message}; it is kept in {self.directory / 'run.json'}", stacklevel=3)

    def _load_resume_point(self, directory: Path) -> None:
        """Take the record of the newest checkpoint of this run's spec: its trace, metrics
        and checkpoints; its variables are restored once the model exists (`restore`)."""
        from worker.record.checkpoint import load_latest

        found, skipped = load_latest(directory, spec_hash=self.spec_hash)
        self._record["warnings"].extend(skipped)
        if found is None or found.kind != "epoch":
            return
        meta = found.meta
        self._record.update(
            trace=list(meta.get("trace") or []),
            data_fingerprints=list(meta.get("data_fingerprints") or []),
            metrics=list(meta.get("metrics") or []),
            checkpoints=list(meta.get("checkpoints") or []),
            resumed_from_epoch=found.epoch,
        )
        self._steps = found.step
        self._consumed().resume_at(found.step)
        self._resume = found

    @property
    def resume_epoch(self) -> int:
        """The epochs a resumed run has done already, until `restore` has restored them."""
        return self._resume.epoch if self._resume is not None and not self._resumed else 0

    @property
    def step(self) -> int:
        """The global step of the last trace point (a resumed run: its checkpoint's)."""
        return self._steps

    def restore(self, model: Any, optimizer: Any | None = None) -> int:
        """Continue a run its worker stopped: put the checkpoint's values into `model` and
        `optimizer` and return the epochs done (0 for a run that starts afresh). The Keras
        callback calls it itself; a custom loop calls it once both exist and starts at the
        epoch after. For a bitwise-equal resume, an epoch's randomness must depend on the
        seed and the epoch alone (e.g. `dataset.shuffle(n, seed=epoch)`)."""
        if self._resume is None or self._resumed:
            return 0
        from worker.record.checkpoint import restore
        from worker.record.variable_reads import training_state

        if optimizer is not None and getattr(optimizer, "built", True) is False:
            optimizer.build(model.trainable_variables)
        restore(self._resume, training_state(model, optimizer))
        self._resumed = True
        return self._resume.epoch

    def _set_up_tensorflow(self, done: ModuleType) -> None:
        """Once TensorFlow, and Keras if it is being imported, have finished importing
        (`done` has just finished: its import still counts as running until this returns)."""
        from worker.record.provenance import capture_provenance
        from worker.training.determinism import configure

        def loaded(name: str) -> bool:
            module = sys.modules.get(name)
            return module is not None and (module is done or not _importing(module))

        if self._record["determinism"] is not None or not loaded("tensorflow"):
            return
        if "keras" in sys.modules and not loaded("keras"):
            return  # Keras imports TensorFlow first: set up once Keras is done too
        try:
            record = configure(self._spec, self.seed)
        except Exception as exc:  # e.g. thread pools fixed by ops the script already ran
            message = f"TensorFlow could not be made deterministic: {exc}"
            self._record["warnings"].append(message)
            self._record["determinism"] = {"error": message}  # not tried again
            self._write()
            warnings.warn(message, DeterminismWarning, stacklevel=2)
            return
        # Unlike a job, a script reseeds TensorFlow's global seed only here.
        record["reseed"] = (
            "at reprotrain.init(); with the Keras callback, Python, NumPy and Keras every "
            "epoch from (seed, 'epoch', epoch)"
        )
        self._record["determinism"] = record
        self._record["provenance"] = capture_provenance(
            spec_hash=self.spec_hash, seed=self.seed, determinism=record
        )
        if self._resume is not None:  # fit starts at the epoch after the checkpoint
            self._cancel_hooks.append(after_import("keras", lambda _: self._hook_fit()))
        self._write()

    @property
    def spec_hash(self) -> str:
        """What makes two runs the same experiment: the run's spec hash when a worker runs
        the script for a run; else the script, its arguments and params."""
        given = os.environ.get(SPEC_HASH_ENV)
        if given:
            return given
        if self._link is not None:
            return str(self._link.spec_hash)
        script = self._record["script"]
        material = {
            "kind": "script",
            "script_sha256": script["sha256"],
            "args": script["args"],
            "params": self._record["params"],
        }
        text = json.dumps(material, sort_keys=True, separators=(",", ":"))
        return "sha256:" + hashlib.sha256(text.encode()).hexdigest()

    def finish(self, status: str = "succeeded") -> None:
        """End the run (`succeeded`, or `failed`); later logging calls are refused."""
        if self.finished:
            return
        if status not in ("succeeded", "failed"):
            raise ValueError("status must be 'succeeded' or 'failed'")
        for cancel in self._cancel_hooks:
            cancel()
        trace = self._record["trace"]
        self._record["final_fingerprint"] = trace[-1]["fingerprint"] if trace else None
        self._record["status"] = status
        self._record["finished_at"] = _now()
        self.finished = True
        if self._metrics_file is not None:
            self._metrics_file.close()
        self._write()
        if self._syncer is not None:
            self._syncer.close()  # the record and every checkpoint are on disk from here
        if self._link is not None and os.getpid() == self._pid:
            self._report()

    def _at_exit(self) -> None:
        if not self.finished and os.getpid() == self._pid:
            self.finish("failed" if self._failed else "succeeded")

    def __enter__(self) -> ScriptRun:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.finish("failed" if kind is not None else "succeeded")

    # -- logging -------------------------------------------------------------------------------

    @property
    def params(self) -> dict[str, Any]:
        """The params logged so far (a copy)."""
        return dict(self._record["params"])

    def log_params(self, params: Mapping[str, Any]) -> None:
        self._open()
        self._record["params"].update(_json_value(dict(params)))
        self._write()

    def set_tags(self, tags: Mapping[str, Any]) -> None:
        self._open()
        self._record["tags"].update({str(k): str(v) for k, v in tags.items()})
        self._write()

    def log_metric(
        self, name: str, value: float, *, step: int | None = None, epoch: int | None = None
    ) -> None:
        self.log_metrics({name: value}, step=step, epoch=epoch)

    def log_metrics(
        self, metrics: Mapping[str, float], *, step: int | None = None, epoch: int | None = None
    ) -> None:
        self._open()
        at = {"step": self._steps if step is None else int(step), "epoch": epoch}
        rows = [{"name": str(name), "value": float(value), **at} for name, value in metrics.items()]
        self._record["metrics"].extend(rows)
        # A line each, flushed: per-step logging must not cost a rewrite and an fsync; the
        # run's record takes them at its next trace point and when the run ends.
        if self._metrics_file is None:
            self._metrics_file = open(self.directory / "metrics.jsonl", "a")  # noqa: SIM115
        self._metrics_file.write("".join(json.dumps(row) + "\n" for row in rows))
        self._metrics_file.flush()

    def log_artifact(self, path: str | os.PathLike[str]) -> None:
        """Copy a file into the run's directory, with its SHA-256."""
        self._open()
        source = Path(path)
        target = self.directory / "artifacts" / source.name
        target.parent.mkdir(exist_ok=True)
        shutil.copyfile(source, target)
        digest = hashlib.sha256(target.read_bytes()).hexdigest()
        self._record["artifacts"].append({"name": source.name, "sha256": digest})
        self._write()

    # -- fingerprints --------------------------------------------------------------------------

    def keras_callback(self, *, every_steps: int | None = None) -> Any:
        """A Keras callback recording the trace: initialisation, every epoch end (and every
        `every_steps` steps), with each epoch's metrics."""
        from worker.script.keras_callback import StepTraceCallback, TraceCallback

        asked = os.environ.get(TRACE_EVERY_ENV)  # a re-trace of a stretch, finer than the run's
        if asked:
            every_steps = int(asked)
            self._record["trace_granularity"] = f"steps:{every_steps}"
        if every_steps is None:
            return TraceCallback(self)
        return StepTraceCallback(self, every_steps=every_steps)

    # -- data ----------------------------------------------------------------------------------

    def dataset(self, dataset: Any) -> Any:
        """`dataset` (a `tf.data.Dataset` of the batches training steps take, one a step),
        digested batch by batch as training consumes it: each epoch's data fingerprint lets
        a divergence be told to come from the data or from the computation. Wrap the data
        the steps train on, and only that (not validation data)."""
        from worker.script.data import tap

        self._open()
        return tap(dataset, self._consumed())

    def autolog(self) -> None:
        """Record every `model.fit` of the script without changing it: the trace callback
        is added to each call, and the data it trains on is digested (a tf.data.Dataset
        batch by batch, arrays whole)."""
        self._open()
        self._autolog = True
        self._cancel_hooks.append(after_import("keras", lambda _: self._hook_fit()))

    @property
    def autologging(self) -> bool:
        return self._autolog and not self.finished

    def fit_data(self, x: Any, y: Any, sample_weight: Any) -> Any:
        """The `x` an autologged `fit` trains on (a dataset: wrapped; arrays: digested)."""
        from worker.script.data import fit_data

        out, warning = fit_data(self._consumed(), x, y, sample_weight)
        if warning is not None:
            self._warn_once(warning)
        return out

    def _hook_fit(self) -> None:
        from worker.script.keras_callback import hook_fit

        hook_fit()

    def _consumed(self) -> ConsumedData:
        if self._data is None:
            from worker.script.data import ConsumedData

            self._data = ConsumedData()
            self._data.resume_at(self._steps)
        return self._data

    def _take_data(self, point: TracePoint) -> None:
        assert self._data is not None
        if point.kind != "epoch":
            self._data.advance(point.step)
            return
        fingerprint, warning = self._data.end_epoch(point.epoch, point.step)
        if fingerprint is not None:
            self._record["data_fingerprints"].append(
                {"epoch": point.epoch, "fingerprint": fingerprint}
            )
        if warning is not None:
            self._warn_once(warning)

    # -- what cannot be made deterministic ------------------------------------------------------

    def _warn_once(self, message: str) -> None:
        """Warn of `message` and record it, once a run."""
        if message in self._warned:
            return
        self._warned.add(message)
        self._record["warnings"].append(message)
        warnings.warn(message, DeterminismWarning, stacklevel=3)

    def _forking(self) -> None:
        if self.finished or os.getpid() != self._pid:
            return
        self._warn_once(
            "the script forked a process (e.g. a multiprocessing data loader): the child "
            "starts from the parent's generator states, and batches made by several "
            "processes can arrive in a different order from run to run; load data with "
            "tf.data (deterministic by default) or in the main process"
        )

    def _watch_numpy(self, numpy: ModuleType) -> None:
        """Warn of a NumPy generator the script's own code makes without a seed
        (`np.random.default_rng()`): it takes fresh entropy from the system, so its draws
        differ on every run. Made by an installed library, it is not the script's
        training randomness, and left alone."""
        random_module = numpy.random
        original = random_module.default_rng
        if getattr(original, "_reprotrain_watched", False):
            return

        def default_rng(seed: Any = None) -> Any:
            caller = sys._getframe(1).f_code.co_filename
            if seed is None and _current is not None and not _current.finished and _own(caller):
                _current._warn_once(
                    "np.random.default_rng() was called without a seed: it draws fresh "
                    "entropy on every run; give it one, e.g. default_rng(run.seed[0])"
                )
            return original(seed)

        default_rng._reprotrain_watched = True  # type: ignore[attr-defined]
        random_module.default_rng = default_rng

    def trace_point(
        self,
        *,
        step: int,
        model: Any,
        optimizer: Any | None = None,
        epoch: int | None = None,
        kind: PointKind | None = None,
    ) -> TracePoint:
        """Record the fingerprint of `model` and `optimizer` now (a custom training loop
        calls it after its steps; `epoch` given and no `kind`: the end of that epoch, whose
        checkpoint a worker's run keeps with the metrics logged so far: log an epoch's
        metrics before its trace point)."""
        from worker.record.fingerprint import fingerprint_read
        from worker.record.variable_reads import training_state

        self._open()
        if kind is None:
            kind = "init" if step == 0 and not epoch else ("epoch" if epoch else "step")
        if optimizer is not None and getattr(optimizer, "built", True) is False:
            # Keras builds an optimizer's slots at its first step; built now (the same zeros,
            # in the same order), every trace point holds the same variables.
            optimizer.build(model.trainable_variables)
        if self._resume is not None:  # a point the resumed run has already: not recorded twice
            for recorded in self._record["trace"]:
                if (recorded["kind"], recorded["epoch"], recorded["step"]) == (
                    kind,
                    int(epoch or 0),
                    int(step),
                ):
                    return TracePoint.model_validate(recorded)
        self._steps = int(step)
        # The state is kept while its variables stay the same ones, so its read handles and
        # hashing lanes are found once (an optimizer builds its variables at the first step).
        key = (
            id(model),
            id(optimizer),
            len(model.variables),
            len(getattr(optimizer, "variables", ())),
        )
        if self._state is None or self._state[0] != key:
            self._state = (key, training_state(model, optimizer))
        fp, values = fingerprint_read(self._state[1])
        point = TracePoint(
            kind=kind,
            epoch=int(epoch or 0),
            step=int(step),
            fingerprint=fp.fingerprint,
            variables=fp.variables,
        )
        self._record["trace"].append(point.model_dump())
        if self._data is not None:
            self._take_data(point)
        if kind == "epoch":
            self._end_of_epoch(point, values)
        self._write()
        if kind == "epoch" and self._until_epoch is not None and point.epoch >= self._until_epoch:
            self._stop_here(point.epoch)
        return point

    def _stop_here(self, epoch: int) -> None:
        """A replay asked to end at this epoch: the run is recorded as it stands and the
        process ends now, whatever the script would do next."""
        self._record["stopped_at_epoch"] = epoch
        self.finish("succeeded")
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)

    def _end_of_epoch(self, point: TracePoint, values: list[Any]) -> None:
        """A worker's run: keep the epoch's checkpoint and say so (the agent uploads it)."""
        if self._progress is not None:
            self._progress.emit(
                "epoch_end", epoch=point.epoch, step=point.step, fingerprint=point.fingerprint
            )
        if self._checkpoint_dir is None or self._state is None:
            return
        from worker.record.checkpoint import save_checkpoint

        name = f"epoch-{point.epoch:06d}.json"
        checkpoints = [*self._record["checkpoints"], name]
        meta = {
            "spec_hash": self.spec_hash,
            "seed": list(self.seed),
            "fingerprint": point.fingerprint,
            "trace": self._record["trace"],
            "data_fingerprints": self._record["data_fingerprints"],
            "metrics": self._record["metrics"],
            "checkpoints": checkpoints,
        }
        save_checkpoint(
            self._checkpoint_dir,
            epoch=point.epoch,
            step=point.step,
            state=self._state[1],
            meta=meta,
            arrays=values,  # read once, for the fingerprint
            syncer=self._sync_pool(),  # complete once renamed; on disk by the end of the run
        )
        self._record["checkpoints"] = checkpoints
        if self._progress is not None:
            self._progress.emit("checkpoint", epoch=point.epoch, step=point.step, path=name)

    # -- the record ----------------------------------------------------------------------------

    @property
    def has_trace(self) -> bool:
        """Whether a trace point was recorded."""
        return bool(self._record["trace"])

    @property
    def record(self) -> dict[str, Any]:
        """What is recorded so far (as written to run.json)."""
        copied: dict[str, Any] = json.loads(json.dumps(self._record))
        return copied

    def _open(self) -> None:
        if self.finished:
            raise RuntimeError(f"run {self.id} is finished")

    def _write(self) -> None:
        """Replace run.json whole (a reader sees the old record or the new one); synced to
        disk in the background, which `finish` waits for: training does not."""
        if os.getpid() != self._pid:
            return  # a process the script forked: the run is its parent's to record
        path = self.directory / "run.json"
        tmp = path.with_name(".run.json.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(json.dumps(self._record, indent=1))
        os.replace(tmp, path)
        self._sync_pool().sync(path)

    def _sync_pool(self) -> Syncer:
        from worker.record.checkpoint import Syncer

        if self._syncer is None:
            self._syncer = Syncer()
        return self._syncer


# Where a freshly seeded generator stands: Python's Mersenne Twister at 624 (its state fully
# used up, refilled on the next draw); NumPy's global one as NumPy leaves it after import.
_FRESH_PYTHON = {624}
_FRESH_NUMPY = {623, 624}
PRE_SEEDED_ENV = "REPRO_RUN_PRE_SEEDED"  # "1": a worker seeded both before the script ran


def drawn_before_init() -> list[str]:
    """What the script drew from Python's or NumPy's global generator before `init()` seeded
    them (say, `np.random.permutation` to split its data): such draws differ run to run,
    unless a worker started the script with both seeded from the run's seed. Found by where
    each generator stands: one drawn from has moved from where seeding leaves it, or from
    where `import reprotrain` left it (its own imports draw, and are not counted). A draw
    that lands a generator back where it stood goes unseen; the rerun's verdict shows it."""
    if os.environ.get(PRE_SEEDED_ENV) == "1":
        return []
    marks = sys.modules.get("reprotrain.generator_marks")
    before = getattr(marks, "BEFORE", None)
    after = getattr(marks, "AFTER", None)
    now_python = random.getstate()[1][-1]
    numpy = sys.modules.get("numpy")
    now_numpy = numpy.random.get_state()[2] if numpy is not None else None

    def moved(index: int, now: int | None, fresh: set[int]) -> bool:
        if now is None:
            return False
        at_start = before[index] if before is not None else None
        at_end = after[index] if after is not None else None
        if at_start is not None and at_start not in fresh:
            return True  # drawn before `import reprotrain`
        return now != at_end if at_end is not None else now not in fresh

    found = [
        name
        for name, index, now, fresh in (
            ("Python's random", 0, now_python, _FRESH_PYTHON),
            ("numpy.random", 1, now_numpy, _FRESH_NUMPY),
        )
        if moved(index, now, fresh)
    ]
    return [
        f"{name} was drawn from before reprotrain.init() seeded it (by the script or a "
        "module it imported): draws like a shuffle or a split made then differ from run to "
        "run; call init() first, or run the script with `repro run`, whose workers seed it "
        "before it starts"
        for name in found
    ]


_LIBRARIES = tuple(
    {sysconfig.get_paths()[key] for key in ("stdlib", "platstdlib", "purelib", "platlib")}
)


def _own(filename: str) -> bool:
    """Whether code in `filename` is the script's own, not an installed library's (whose
    generators made at import, say, are not the script's training randomness)."""
    return not filename.startswith(_LIBRARIES) and not filename.startswith("<frozen")


def _now() -> str:
    return datetime.now(UTC).isoformat().replace("+00:00", "Z")


def _importing(module: ModuleType) -> bool:
    """Whether the module is still running its own import."""
    return bool(getattr(getattr(module, "__spec__", None), "_initializing", False))
