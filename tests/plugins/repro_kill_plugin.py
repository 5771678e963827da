"""A test-only architecture whose process SIGKILLs itself right after a chosen step."""

from __future__ import annotations

import os
import signal
from typing import Any

KILL_VARIABLE = "REPRO_TEST_SIGKILL_AFTER_STEP"


def killable_mlp(params: dict[str, Any], data: Any) -> Any:
    """An MLP with BatchNorm and Dropout; with REPRO_TEST_SIGKILL_AFTER_STEP=N set, the job
    process kills itself with SIGKILL right after optimizer step N, as a lost machine would.

    Killing changes no value in runs that are not killed, so a killed-and-resumed run can be
    compared with an uninterrupted run of the same spec.
    """
    import keras

    inputs = keras.Input(shape=data.x_shape, name="inputs")
    h = keras.layers.Dense(int(params.get("width", 16)), activation="relu", name="hidden")(inputs)
    h = keras.layers.BatchNormalization(name="norm")(h)
    h = keras.layers.Dropout(0.25, name="drop")(h)
    model = keras.Model(inputs, keras.layers.Dense(data.output_dim, name="out")(h))
    kill_after = os.environ.get(KILL_VARIABLE)
    if kill_after:

        class Kill(keras.callbacks.Callback):  # type: ignore[misc]
            def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
                if (logs or {}).get("step") == int(kill_after):
                    os.kill(os.getpid(), signal.SIGKILL)

        model.training_callbacks = [Kill()]
    return model
