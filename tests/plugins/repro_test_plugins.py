"""Test-only components, registered through the real entry-point mechanism by the tests."""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from worker.data.batch_source import BatchSource


def stateful_noise(params: dict[str, Any], *, batch_size: int) -> BatchSource:
    """Breaks the contract on purpose: draws from TensorFlow's stateful RNG."""

    def stateful_noise_batch(indices: tf.Tensor, seed: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        n = tf.shape(indices)[0]
        x = tf.random.uniform([n, 4])
        return x, tf.cast(x[:, 0] > 0.5, tf.int32)

    return BatchSource(stateful_noise_batch, num_classes=2)


def entropy_noise(params: dict[str, Any], *, batch_size: int) -> BatchSource:
    """Nondeterministic data on purpose: a stateful RNG op seeded from OS entropy per process,
    as code that seeds from the clock does. Two runs of one spec train on different data."""
    import secrets

    op_seed = secrets.randbits(31)

    def entropy_noise_batch(indices: tf.Tensor, seed: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        n = tf.shape(indices)[0]
        x = tf.random.uniform([n, 4], seed=op_seed)
        return x, tf.cast(x[:, 0] > 0.5, tf.int32)

    return BatchSource(entropy_noise_batch, num_classes=2)


def scalar_output(params: dict[str, Any], *, batch_size: int) -> BatchSource:
    """Breaks the contract on purpose: returns a scalar instead of a batch."""

    def scalar_output_batch(indices: tf.Tensor, seed: tf.Tensor) -> tf.Tensor:
        return tf.reduce_sum(tf.random.stateless_normal([4], seed=seed))

    return BatchSource(scalar_output_batch, num_classes=2)


def wide_mlp(params: dict[str, Any], data: Any) -> Any:
    """A third-party architecture: one hidden layer whose width comes from params."""
    import keras

    inputs = keras.Input(shape=data.x_shape, name="inputs")
    h = keras.layers.Dense(int(params.get("width", 16)), activation="relu", name="wide")(inputs)
    return keras.Model(inputs, keras.layers.Dense(data.output_dim, name="out")(h))


def noisy_mlp(params: dict[str, Any], data: Any) -> Any:
    """An MLP that adds noise from a stateful TensorFlow RNG op (seeded by the global seed)
    to its hidden layer while training: reproducible only if the seed is set every epoch."""
    import keras
    import tensorflow as tf

    class StatefulNoise(keras.layers.Layer):  # type: ignore[misc]
        def call(self, x: Any, training: bool = False) -> Any:
            if not training:
                return x
            return x + 0.01 * tf.random.uniform(tf.shape(x), seed=7)

    inputs = keras.Input(shape=data.x_shape, name="inputs")
    h = keras.layers.Dense(8, activation="relu", name="hidden")(inputs)
    h = StatefulNoise(name="noise")(h)
    return keras.Model(inputs, keras.layers.Dense(data.output_dim, name="out")(h))


PERTURB_VARIABLE = "REPRO_TEST_PERTURB"


def _perturbation() -> tuple[str, str, int] | None:
    """(variable path, "epoch" or "step", number) from REPRO_TEST_PERTURB, e.g.
    `model/hidden/kernel@epoch:2` or `model/hidden/kernel@step:7`; None when unset."""
    import os

    value = os.environ.get(PERTURB_VARIABLE)
    if not value:
        return None
    path, _, when = value.partition("@")
    unit, _, number = when.partition(":")
    if unit not in ("epoch", "step") or not number.isdigit():
        raise ValueError(f"{PERTURB_VARIABLE}={value!r}: expected PATH@epoch:N or PATH@step:N")
    return path, unit, int(number)


def perturbed_mlp(params: dict[str, Any], data: Any) -> Any:
    """A small MLP that, when REPRO_TEST_PERTURB says so, nudges one variable by one ULP.

    Plants nondeterministic compute the way a flaky kernel would, in one run only: the
    nudge (the first element moved to the next float up) happens after the given epoch,
    before its trace point, or right after the given optimizer step.
    """
    import keras
    import numpy as np

    inputs = keras.Input(shape=data.x_shape, name="inputs")
    h = keras.layers.Dense(16, activation="relu", name="hidden")(inputs)
    model = keras.Model(inputs, keras.layers.Dense(data.output_dim, name="out")(h))
    plan = _perturbation()
    if plan is None:
        return model
    target, unit, number = plan
    matches = [v for v in model.variables if f"model/{v.path}" == target]
    if not matches:
        raise ValueError(f"{PERTURB_VARIABLE}: the model has no variable {target!r}")
    variable = matches[0]

    class OneUlp(keras.callbacks.Callback):  # type: ignore[misc]
        def _nudge(self) -> None:
            value = np.array(variable.numpy())
            value.flat[0] = np.nextafter(value.flat[0], np.inf)
            variable.assign(value)

        def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
            if unit == "epoch" and (logs or {}).get("epoch") == number:
                self._nudge()

        def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
            if unit == "step" and (logs or {}).get("step") == number:
                self._nudge()

    model.training_callbacks = [OneUlp()]
    return model


SWAP_VARIABLE = "REPRO_TEST_SWAP"


def twin_mlp(params: dict[str, Any], data: Any) -> Any:
    """An MLP with two hidden layers of one width, so their biases have one shape; when
    REPRO_TEST_SWAP says `epoch:N`, the two biases trade values after epoch N, before its
    trace point: a self-consistent state that training never produced, as a dishonest or
    broken worker could report."""
    import os

    import keras

    inputs = keras.Input(shape=data.x_shape, name="inputs")
    h = keras.layers.Dense(16, activation="relu", name="first")(inputs)
    h = keras.layers.Dense(16, activation="relu", name="second")(h)
    model = keras.Model(inputs, keras.layers.Dense(data.output_dim, name="out")(h))
    when = os.environ.get(SWAP_VARIABLE, "")
    if not when:
        return model
    unit, _, number = when.partition(":")
    if unit != "epoch" or not number.isdigit():
        raise ValueError(f"{SWAP_VARIABLE}={when!r}: expected epoch:N")
    a, b = (model.get_layer(name).bias for name in ("first", "second"))

    class Swap(keras.callbacks.Callback):  # type: ignore[misc]
        def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
            if (logs or {}).get("epoch") == int(number):
                first, second = a.numpy(), b.numpy()
                a.assign(second)
                b.assign(first)

    model.training_callbacks = [Swap()]
    return model


def paced_mlp(params: dict[str, Any], data: Any) -> Any:
    """A small MLP whose training sleeps `step_seconds` after every optimizer step.

    Sleeping changes no value, so runs stay bitwise reproducible; it gives tests that must
    act mid-epoch (killing a worker, say) a window that does not depend on machine speed.
    """
    import time

    import keras

    pause = float(params.get("step_seconds", 0.02))
    inputs = keras.Input(shape=data.x_shape, name="inputs")
    h = keras.layers.Dense(16, activation="relu", name="hidden")(inputs)
    model = keras.Model(inputs, keras.layers.Dense(data.output_dim, name="out")(h))

    class Pace(keras.callbacks.Callback):  # type: ignore[misc]
        def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
            time.sleep(pause)

    model.training_callbacks = [Pace()]
    return model
