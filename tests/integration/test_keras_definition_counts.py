"""The checker's TensorFlow-free parameter count equals Keras's `count_params()` for models
built of the allow-listed layers, and an accepted definition loads in Keras's safe mode."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

import keras
import pytest

from worker.data.batch_source import DataInfo
from worker.models import keras_definition as kd
from worker.models.keras_model import from_definition

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "models"
L = keras.layers


def _images() -> keras.Model:
    x = keras.Input((12, 12, 3))
    h = L.Conv2D(6, 3, padding="same", kernel_regularizer=keras.regularizers.L2(1e-4))(x)
    h = L.BatchNormalization(center=False)(h)
    h = L.DepthwiseConv2D(3, depth_multiplier=2)(h)
    h = L.SeparableConv2D(5, 3, use_bias=False)(h)
    h = L.Conv2D(4, 1, groups=1, kernel_constraint=keras.constraints.MaxNorm(2.0))(h)
    h = L.Conv2DTranspose(3, 2, strides=2)(h)
    h = L.GroupNormalization(groups=3)(h)
    h = L.MaxPooling2D()(h)
    h = L.GlobalAveragePooling2D()(h)
    h = L.Dense(7, activation="gelu", kernel_initializer="he_normal")(h)
    return keras.Model(x, L.Dense(3)(h))


def _sequences() -> keras.Model:
    x = keras.Input((10,), dtype="int32")
    h = L.Embedding(50, 8)(x)
    a = L.MultiHeadAttention(2, 4, value_dim=3)(h, h)
    h = L.LayerNormalization()(h + a)
    h = L.Conv1D(6, 3, padding="causal")(h)
    r = L.Bidirectional(L.LSTM(4, return_sequences=True))(h)
    r = L.GRU(5, reset_after=False, return_sequences=True)(r)
    r = L.SimpleRNN(3)(r)
    return keras.Model(x, L.Dense(2)(r))


def _sequential() -> keras.Model:
    return keras.Sequential(
        [keras.Input((6,)), L.Dense(4), L.Dropout(0.1), L.LayerNormalization(center=False)]
    )


def _nested() -> keras.Model:
    inner = keras.Sequential([keras.Input((5,)), L.Dense(3), L.ReLU()], name="block")
    x = keras.Input((5,))
    return keras.Model(x, L.Dense(2)(inner(x)))


BUILDERS: dict[str, Callable[[], keras.Model]] = {
    "images": _images,
    "sequences": _sequences,
    "sequential": _sequential,
    "nested": _nested,
}


@pytest.mark.parametrize("name", sorted(BUILDERS))
def test_the_count_without_tensorflow_is_keras_count(name: str) -> None:
    model = BUILDERS[name]()
    info = kd.read_definition(model.to_json().encode())
    assert info.parameter_count == model.count_params()
    assert sum(layer.parameters for layer in info.layers) == model.count_params()


def test_the_examples_count_as_keras_counts_them() -> None:
    sys.path.insert(0, str(EXAMPLES))
    try:
        import resnet20  # type: ignore[import-not-found]
        import text_classifier  # type: ignore[import-not-found]
    finally:
        sys.path.remove(str(EXAMPLES))
    for model, file in (
        (resnet20.resnet20(), "resnet20.json"),
        (text_classifier.text_classifier(), "text_classifier.json"),
    ):
        info = kd.read_definition((EXAMPLES / file).read_bytes())
        assert info.parameter_count == model.count_params()
        # The committed JSON is what the script writes today.
        assert kd.read_definition(model.to_json().encode()).layer_records() == info.layer_records()


def test_an_accepted_definition_loads_in_safe_mode_with_its_layer_names() -> None:
    data = (EXAMPLES / "resnet20.json").read_bytes()
    model = from_definition(
        {}, DataInfo((32, 32, 3), "float32", (), "int32", 10, None), definition=data
    )
    assert model.count_params() == 274_042
    assert {layer.name for layer in model.layers} >= {"stem_conv", "logits"}


def test_a_saved_keras_file_of_a_compiled_model_is_read_for_its_architecture_alone(
    tmp_path: Path,
) -> None:
    model = _sequential()
    model.compile(optimizer="adam", loss="mse", metrics=["mae"])
    model.save(tmp_path / "model.keras")
    info = kd.read_definition((tmp_path / "model.keras").read_bytes())
    assert info.format == "keras_archive"
    assert info.parameter_count == model.count_params()
    assert "compile_config" not in info.config  # the spec's optimizer and loss are used
    loaded = keras.saving.deserialize_keras_object(info.config, safe_mode=True)
    assert loaded.count_params() == model.count_params()
    assert not loaded.compiled
