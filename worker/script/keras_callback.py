"""The Keras callback that records a script run's trace while `model.fit` trains."""

from __future__ import annotations

import functools
import inspect
from typing import TYPE_CHECKING, Any

import keras

from worker.training.determinism import reseed

if TYPE_CHECKING:
    from worker.script.run import ScriptRun


class TraceCallback(keras.callbacks.Callback):  # type: ignore[misc]
    """Fingerprints at initialisation and every epoch end (model, optimizer and the
    seed-generator states the model holds), and each epoch's metrics as Keras reports them.

    It has no per-batch hook, so Keras calls nothing of it between an epoch's steps (a
    batch hook makes every step, or every call of `steps_per_execution` steps, wait for
    its logs); the global step is the optimizer's own count of the steps it applied."""

    def __init__(self, run: ScriptRun, *, every_steps: int | None = None) -> None:
        super().__init__()
        if every_steps is not None and every_steps < 1:
            raise ValueError("every_steps must be at least 1")
        self.run = run
        self.every_steps = every_steps
        self._epoch = 0

    def _optimizer(self) -> Any:
        return getattr(self.model, "optimizer", None)

    def _global_step(self) -> int:
        return int(self._optimizer().iterations.numpy())

    def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
        if self.run.resume_epoch:
            self.run.restore(self.model, self._optimizer())
        if not self.run.has_trace:
            self.run.trace_point(step=0, model=self.model, optimizer=self._optimizer())

    def on_epoch_begin(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        self._epoch = epoch + 1
        # Python's, NumPy's and Keras's global generators from (seed, epoch), as the job
        # runtime does, so a run resumed at this epoch draws what it would have drawn.
        # TensorFlow's global seed stays: setting it would retrace every compiled step.
        reseed(self.run.seed, "epoch", self._epoch, tensorflow=False)

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        step = self._global_step()
        # The metrics first: the epoch's checkpoint, written at its trace point, keeps them.
        numbers = {k: float(v) for k, v in (logs or {}).items() if _is_number(v)}
        if numbers:
            self.run.log_metrics(numbers, step=step, epoch=epoch + 1)
        self.run.trace_point(
            step=step,
            epoch=epoch + 1,
            kind="epoch",
            model=self.model,
            optimizer=self._optimizer(),
        )


class StepTraceCallback(TraceCallback):
    """`TraceCallback`, and a fingerprint every `every_steps` optimizer steps: at the end of
    the first call of `steps_per_execution` steps that reaches each multiple."""

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        assert self.every_steps is not None
        step = self._global_step()
        last = self.run.step
        if step // self.every_steps > last // self.every_steps:
            self.run.trace_point(
                step=step,
                epoch=self._epoch,
                kind="step",
                model=self.model,
                optimizer=self._optimizer(),
            )


def _is_number(value: Any) -> bool:
    try:
        float(value)
    except (TypeError, ValueError):
        return False
    return True


def hook_fit() -> None:
    """Wrap `keras.Model.fit` (once) for the run `init()` started in this process:
    - under `reprotrain.autolog()`, each call gets the run's trace callback and its data is
      digested (a tf.data.Dataset batch by batch as consumed, arrays whole);
    - a resumed run's call with the run's callback and no `initial_epoch` of its own starts
      at the epoch after its checkpoint (once restored, the run's resume epoch is 0, and
      later calls train as they say)."""
    original = keras.Model.fit
    if getattr(original, "_reprotrain_hook", False):
        return
    signature = inspect.signature(original)

    @functools.wraps(original)
    def fit(model: Any, *args: Any, **kwargs: Any) -> Any:
        from worker.script.run import current

        run = current()
        if run is None:
            return original(model, *args, **kwargs)
        bound = signature.bind(model, *args, **kwargs)
        given = bound.arguments
        callbacks = list(given.get("callbacks") or [])
        ours = any(isinstance(c, TraceCallback) and c.run is run for c in callbacks)
        if run.autologging:
            if not ours:
                given["callbacks"] = [*callbacks, run.keras_callback()]
                ours = True
            given["x"] = run.fit_data(given.get("x"), given.get("y"), given.get("sample_weight"))
        if ours and run.resume_epoch and "initial_epoch" not in given:
            given["initial_epoch"] = run.resume_epoch
        return original(*bound.args, **bound.kwargs)

    fit._reprotrain_hook = True  # type: ignore[attr-defined]
    keras.Model.fit = fit
