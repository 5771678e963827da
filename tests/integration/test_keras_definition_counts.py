"""The checker's TensorFlow-free parameter count equals Keras's `count_params()` for models
built of the allow-listed layers, and an accepted definition loads in Keras's safe mode."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable
from pathlib import Path

import keras
import pytest
from keras.src import api_export

from worker.data.batch_source import DataInfo
from worker.models import keras_definition as kd
from worker.models.definition_allow_list import (
    ACTIVATIONS_MODULE,
    FUNCTIONS,
    LAYERS,
    MODULES,
    OPERATIONS,
)
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


# --- every layer's output shape, as Keras computes it ----------------------------------


def _convolutions_2d() -> keras.Model:
    x = keras.Input((17, 15, 4))
    h = L.Conv2D(6, 3, strides=2, dilation_rate=1)(x)
    h = L.ZeroPadding2D(((1, 2), (3, 0)))(h)
    h = L.Conv2D(5, (3, 2), padding="same", dilation_rate=2)(h)
    h = L.DepthwiseConv2D(3, strides=2, padding="same", depth_multiplier=2)(h)
    h = L.SeparableConv2D(4, 2, strides=(1, 2))(h)
    h = L.Conv2DTranspose(3, 3, strides=2, padding="same")(h)
    h = L.Conv2DTranspose(3, 3, strides=2, output_padding=1)(h)
    h = L.Cropping2D(((1, 0), (2, 1)))(h)
    h = L.UpSampling2D((2, 3))(h)
    h = L.MaxPooling2D(3, strides=2, padding="same")(h)
    h = L.AveragePooling2D((2, 3))(h)
    h = L.SpatialDropout2D(0.1)(h)
    h = L.BatchNormalization()(h)
    h = L.GroupNormalization(groups=3)(h)
    h = L.UnitNormalization()(h)
    h = L.Rescaling(0.5)(h)
    k = L.GlobalMaxPooling2D(keepdims=True)(h)
    h = L.Activation("relu")(h)
    h = L.ReLU()(L.LeakyReLU()(L.ELU()(L.Softmax()(L.Identity()(h)))))
    g = L.GlobalAveragePooling2D()(h)
    return keras.Model(x, L.Dense(3)(L.Concatenate()([g, L.Flatten()(k)])))


def _convolutions_1d() -> keras.Model:
    x = keras.Input((40, 3))
    h = L.Conv1D(4, 3, padding="causal", dilation_rate=2)(x)
    h = L.Conv1DTranspose(5, 4, strides=3)(h)
    h = L.DepthwiseConv1D(3, depth_multiplier=2)(h)
    h = L.SeparableConv1D(4, 5, strides=2, padding="same")(h)
    h = L.ZeroPadding1D((2, 1))(h)
    h = L.Cropping1D((1, 3))(h)
    h = L.UpSampling1D(3)(h)
    h = L.MaxPooling1D(4)(h)
    h = L.AveragePooling1D(3, strides=2, padding="same")(h)
    h = L.SpatialDropout1D(0.1)(L.Dropout(0.1)(h))
    h = L.AlphaDropout(0.1)(L.GaussianDropout(0.1)(L.GaussianNoise(0.1)(h)))
    a = L.GlobalMaxPooling1D()(h)
    b = L.GlobalAveragePooling1D(keepdims=True)(h)
    return keras.Model(x, L.Dense(2)(L.Concatenate()([a, L.Flatten()(b)])))


def _convolutions_3d() -> keras.Model:
    x = keras.Input((9, 8, 7, 2))
    h = L.Conv3D(3, 2, strides=(1, 2, 1))(x)
    h = L.Conv3DTranspose(2, 3, strides=2, padding="same")(h)
    h = L.ZeroPadding3D(1)(h)
    h = L.Cropping3D(((1, 1), (0, 2), (1, 0)))(h)
    h = L.UpSampling3D((1, 2, 1))(h)
    h = L.MaxPooling3D(2)(h)
    h = L.AveragePooling3D(2, padding="same")(h)
    h = L.SpatialDropout3D(0.1)(h)
    a = L.GlobalMaxPooling3D()(h)
    b = L.GlobalAveragePooling3D()(h)
    return keras.Model(x, L.Dense(2)(L.Add()([a, b])))


def _merges() -> keras.Model:
    x = keras.Input((12,))
    a, b = L.Dense(6)(x), L.Dense(6)(x)
    m = [L.Add()([a, b]), L.Subtract()([a, b]), L.Multiply()([a, b])]
    m += [L.Average()([a, b]), L.Maximum()([a, b]), L.Minimum()([a, b])]
    h = L.Concatenate(axis=1)(m)
    r = L.Reshape((-1, 4))(h)
    p = L.Permute((2, 1))(r)
    v = L.RepeatVector(5)(L.Dense(3)(x))
    d = L.Dot(axes=(1, 2), normalize=True)([p, L.Reshape((3, 4))(L.Dense(12)(x))])
    t = L.Dot(axes=-1)([v, v])
    return keras.Model(x, L.Dense(2)(L.Concatenate()([L.Flatten()(d), L.Flatten()(t)])))


def _recurrent() -> keras.Model:
    x = keras.Input((10,), dtype="int32")
    e = L.Embedding(30, 6)(x)
    seq, h, c = L.LSTM(4, return_sequences=True, return_state=True)(e)
    g = L.GRU(5, return_sequences=True)(seq, initial_state=[h])
    fw, bw = L.Bidirectional(L.SimpleRNN(3, return_sequences=True), merge_mode=None)(g)
    s = L.Bidirectional(L.GRU(2), merge_mode="sum")(L.Concatenate()([fw, bw]))
    o, *states = L.Bidirectional(L.LSTM(2, return_state=True))(e)
    att, scores = L.MultiHeadAttention(2, 3, output_shape=7)(
        seq, e, key=g, return_attention_scores=True
    )
    n = L.LayerNormalization()(att)
    pooled = L.GlobalAveragePooling1D()(n)
    return keras.Model(
        x, L.Dense(2)(L.Concatenate()([s, o, *states, pooled, L.Flatten()(scores), c]))
    )


def _operations() -> keras.Model:
    x = keras.Input((5, 4))
    h = L.Dense(4)(x)
    m = keras.ops.mean(h * x, axis=1, keepdims=True)
    s = keras.ops.sum(-m / 2.0, axis=-1)
    return keras.Model(x, L.Dense(2)(s + 1.0 - s))


def _nested_and_shared() -> keras.Model:
    seq = keras.Sequential([L.Dense(4), L.Dense(3)], name="unbuilt_input")
    seq.build((None, 6))
    inner_x = keras.Input((6,))
    inner = keras.Model(inner_x, seq(inner_x), name="fn")
    x = keras.Input((6,))
    shared = L.Dense(6, name="shared")
    a, b = shared(x), shared(L.ReLU()(x))
    return keras.Model(x, L.Dense(2)(L.Concatenate()([inner(a), inner(b)])))


SHAPE_BUILDERS: dict[str, Callable[[], keras.Model]] = {
    **BUILDERS,
    "convolutions_2d": _convolutions_2d,
    "convolutions_1d": _convolutions_1d,
    "convolutions_3d": _convolutions_3d,
    "merges": _merges,
    "recurrent": _recurrent,
    "operations": _operations,
    "nested_and_shared": _nested_and_shared,
}


def _keras_shapes(model: keras.Model, prefix: str) -> dict[str, tuple[tuple[int | None, ...], ...]]:
    """Each layer's path and the output shapes of its first call, as Keras built them."""
    found = {}
    layers = model._layers if isinstance(model, keras.Sequential) else model.operations
    for layer in layers:
        if isinstance(layer, keras.Model):
            found.update(_keras_shapes(layer, f"{prefix}/{layer.name}"))
            continue
        node = layer._inbound_nodes[0]
        found[f"{prefix}/{layer.name}"] = tuple(tuple(t.shape) for t in node.output_tensors)
    return found


@pytest.mark.parametrize("name", sorted(SHAPE_BUILDERS))
def test_every_layer_s_output_shape_and_count_are_keras_own(name: str) -> None:
    model = SHAPE_BUILDERS[name]()
    info = kd.read_definition(model.to_json().encode())
    assert info.parameter_count == model.count_params()
    ours = {layer.path: layer.output_shapes for layer in info.layers}
    assert ours == _keras_shapes(model, model.name)


def test_every_allow_listed_layer_class_is_held_against_keras() -> None:
    seen = set()
    for builder in SHAPE_BUILDERS.values():
        info = kd.read_definition(builder().to_json().encode())
        seen |= {layer.class_name for layer in info.layers}
    assert seen >= LAYERS | OPERATIONS


def test_every_allow_listed_module_is_one_keras_loads_the_class_from() -> None:
    for class_name, modules in MODULES.items():
        for module in modules:
            found = api_export.get_symbol_from_name(f"{module}.{class_name}")
            if found is None:  # written under its defining module (Functional)
                found = getattr(importlib.import_module(module), class_name, None)
            assert found is not None, (module, class_name)
    for name in FUNCTIONS:
        assert api_export.get_symbol_from_name(f"{ACTIVATIONS_MODULE}.{name}") is not None, name
