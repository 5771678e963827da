"""The Keras callback that records a script run's trace while `model.fit` trains."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import keras

if TYPE_CHECKING:
    from worker.script.run import ScriptRun


class TraceCallback(keras.callbacks.Callback):  # type: ignore[misc]
    """Fingerprints at initialisation, every epoch end and every `every_steps` optimizer
    steps (model, optimizer and the seed-generator states the model holds), and each
    epoch's metrics as Keras reports them."""

    def __init__(self, run: ScriptRun, *, every_steps: int | None = None) -> None:
        super().__init__()
        if every_steps is not None and every_steps < 1:
            raise ValueError("every_steps must be at least 1")
        self.run = run
        self.every_steps = every_steps
        self._step = 0
        self._epoch = 0

    def _optimizer(self) -> Any:
        return getattr(self.model, "optimizer", None)

    def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
        if not self.run.has_trace:
            self.run.trace_point(step=0, model=self.model, optimizer=self._optimizer())

    def on_epoch_begin(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        self._epoch = epoch + 1

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        self._step += 1
        if self.every_steps is not None and self._step % self.every_steps == 0:
            self.run.trace_point(
                step=self._step,
                epoch=self._epoch,
                kind="step",
                model=self.model,
                optimizer=self._optimizer(),
            )

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        self.run.trace_point(
            step=self._step,
            epoch=epoch + 1,
            kind="epoch",
            model=self.model,
            optimizer=self._optimizer(),
        )
        numbers = {k: float(v) for k, v in (logs or {}).items() if _is_number(v)}
        if numbers:
            self.run.log_metrics(numbers, step=self._step, epoch=epoch + 1)


def _is_number(value: Any) -> bool:
    try:
        float(value)
    except (TypeError, ValueError):
        return False
    return True
