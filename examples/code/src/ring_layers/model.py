"""An architecture with a custom layer: radial features (x, y, r²) before a small MLP."""

from __future__ import annotations

from typing import Any

import keras


class RadialFeatures(keras.layers.Layer):  # type: ignore[misc]
    """Appends the squared distance from the origin to each point."""

    def call(self, x: Any) -> Any:
        r2 = keras.ops.sum(x * x, axis=-1, keepdims=True)
        return keras.ops.concatenate([x, r2], axis=-1)


def ring_mlp(params: dict[str, Any], data: Any) -> Any:
    """RadialFeatures, then one hidden layer of `hidden` units."""
    inputs = keras.Input(shape=data.x_shape, name="inputs")
    h = RadialFeatures(name="radial")(inputs)
    h = keras.layers.Dense(int(params.get("hidden", 8)), activation="relu", name="hidden")(h)
    return keras.Model(inputs, keras.layers.Dense(data.output_dim, name="out")(h))
