"""The TensorFlow-free checker of Keras model definitions: what it accepts, what it refuses
(naming the layer path and class), its bounds, and the parameter count it computes."""

from __future__ import annotations

import copy
import io
import json
import zipfile
from pathlib import Path
from typing import Any

import pytest

from worker.data.batch_source import DataInfo
from worker.errors import SpecError
from worker.models import keras_definition as kd

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "models"


def _resnet() -> dict[str, Any]:
    config: dict[str, Any] = json.loads((EXAMPLES / "resnet20.json").read_text())
    return config


def _text(config: dict[str, Any]) -> bytes:
    return json.dumps(config).encode()


def _layer(config: dict[str, Any], name: str) -> dict[str, Any]:
    found = [la for la in config["config"]["layers"] if la["config"].get("name") == name]
    assert found, name
    layer: dict[str, Any] = found[0]
    return layer


def _archive(members: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for name, data in members.items():
            zf.writestr(name, data)
    return buf.getvalue()


def test_the_resnet20_example_is_accepted_with_its_parameters_and_layers() -> None:
    info = kd.read_definition((EXAMPLES / "resnet20.json").read_bytes())
    assert info.format == "keras_json"
    assert info.parameter_count == 274_042  # keras: resnet20().count_params()
    assert info.input_shape == (32, 32, 3) and info.input_dtype == "float32"
    assert info.output_units == 10
    paths = [layer.path for layer in info.layers]
    assert "resnet20/stem_conv" in paths and "resnet20/logits" in paths
    logits = next(layer for layer in info.layers if layer.path == "resnet20/logits")
    assert logits.class_name == "Dense" and logits.parameters == 64 * 10 + 10


def test_the_text_classifier_example_takes_token_ids() -> None:
    info = kd.read_definition((EXAMPLES / "text_classifier.json").read_bytes())
    assert info.parameter_count == 38_468  # keras: text_classifier().count_params()
    assert info.input_shape == (64,) and info.input_dtype == "int32"


def test_a_keras_archive_is_read_from_its_config_alone() -> None:
    config = (EXAMPLES / "resnet20.json").read_bytes()
    data = _archive({"metadata.json": b"{}", "config.json": config, "model.weights.h5": b"\0" * 64})
    info = kd.read_definition(data)
    assert info.format == "keras_archive"
    assert info.parameter_count == 274_042


def test_a_lambda_layer_is_refused_naming_its_path_and_class() -> None:
    config = _resnet()
    pool = _layer(config, "pool")
    pool.update(
        class_name="Lambda",
        module="keras.layers",
        config={**pool["config"], "function": {"class_name": "__lambda__", "config": {}}},
    )
    with pytest.raises(kd.DefinitionRefused) as refused:
        kd.read_definition(_text(config))
    assert refused.value.path == "resnet20/pool"
    assert refused.value.class_name == "Lambda"
    assert "Lambda" in str(refused.value) and "resnet20/pool" in str(refused.value)


def _with_nested(change: dict[str, Any]) -> dict[str, Any]:
    config = _resnet()
    conv = _layer(config, "stem_conv")
    conv["config"]["kernel_initializer"].update(change)
    return config


@pytest.mark.parametrize(
    ("change", "said"),
    [
        ({"module": "my_package.initializers"}, "my_package.initializers"),
        ({"class_name": "MyInit", "registered_name": "my_package>MyInit"}, "custom objects"),
        ({"class_name": "MyInit"}, "MyInit"),
        ({"module": None}, "GlorotUniform"),
        ({"class_name": "function", "module": "os", "config": "system"}, "'os'"),
    ],
)
def test_custom_objects_and_foreign_modules_are_refused_where_they_nest(
    change: dict[str, Any], said: str
) -> None:
    with pytest.raises(kd.DefinitionRefused) as refused:
        kd.read_definition(_text(_with_nested(change)))
    assert refused.value.path == "resnet20/stem_conv/kernel_initializer"
    assert said in str(refused.value)


def test_a_layer_class_outside_the_allow_list_is_refused() -> None:
    config = _resnet()
    _layer(config, "pool").update(class_name="TFSMLayer", module="keras.layers")
    with pytest.raises(kd.DefinitionRefused, match=r"TFSMLayer.*allow-list"):
        kd.read_definition(_text(config))


def test_an_unknown_activation_name_is_refused() -> None:
    config = _resnet()
    _layer(config, "logits")["config"]["activation"] = "my_activation"
    with pytest.raises(kd.DefinitionRefused, match="resnet20/logits/activation"):
        kd.read_definition(_text(config))


def test_a_model_nested_as_a_layer_is_walked_too() -> None:
    inner = copy.deepcopy(_resnet())
    outer = copy.deepcopy(_resnet())
    inner["config"]["name"] = "backbone"
    _layer(inner, "pool").update(class_name="Lambda")
    outer["config"]["layers"].append(inner)
    with pytest.raises(kd.DefinitionRefused) as refused:
        kd.read_definition(_text(outer))
    assert refused.value.path == "resnet20/backbone/pool"


def test_sizes_depth_and_layer_count_are_bounded() -> None:
    data = (EXAMPLES / "resnet20.json").read_bytes()
    with pytest.raises(kd.DefinitionRefused, match="REPRO_MAX_MODEL_DEFINITION_BYTES"):
        kd.read_definition(data, limits=kd.DefinitionLimits(max_bytes=len(data) - 1))
    with pytest.raises(kd.DefinitionRefused, match="REPRO_MAX_MODEL_DEFINITION_LAYERS"):
        kd.read_definition(data, limits=kd.DefinitionLimits(max_layers=10))
    with pytest.raises(kd.DefinitionRefused, match="REPRO_MAX_MODEL_DEFINITION_DEPTH"):
        kd.read_definition(data, limits=kd.DefinitionLimits(max_depth=5))
    deep = b"[" * 100_000 + b"]" * 100_000
    with pytest.raises(kd.DefinitionRefused, match="nests deeper"):
        kd.read_definition(deep)
    with pytest.raises(kd.DefinitionRefused, match="not a JSON number"):
        kd.read_definition(b'{"class_name": "Functional", "x": NaN}')
    with pytest.raises(kd.DefinitionRefused, match="invalid JSON"):
        kd.read_definition(b"\xff\xfe not json")


@pytest.mark.parametrize(
    ("members", "said"),
    [
        ({"metadata.json": b"{}"}, "exactly one config.json"),
        ({"../config.json": b"{}"}, "exactly one config.json"),
        ({f"w{i}": b"" for i in range(kd.MAX_ARCHIVE_MEMBERS + 1)}, "members"),
    ],
)
def test_archives_without_one_plain_config_are_refused(
    members: dict[str, bytes], said: str
) -> None:
    with pytest.raises(kd.DefinitionRefused, match=said):
        kd.read_definition(_archive(members))


def test_an_archive_whose_config_inflates_past_the_bound_is_refused_before_reading() -> None:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("config.json", b" " * (8 * 1024**2))
    with pytest.raises(kd.DefinitionRefused, match="declares"):
        kd.read_definition(buf.getvalue())


def test_an_unbuilt_layer_is_refused_since_its_size_is_unknown() -> None:
    config = _resnet()
    del _layer(config, "logits")["build_config"]
    with pytest.raises(kd.DefinitionRefused, match="no input shape recorded") as refused:
        kd.read_definition(_text(config))
    assert refused.value.path == "resnet20/logits"


def test_the_spec_fields_go_together() -> None:
    kd.check_spec_fields("keras", "sha256:" + "a" * 64)
    kd.check_spec_fields("mlp", None)
    with pytest.raises(SpecError) as missing:
        kd.check_spec_fields("keras", None)
    assert missing.value.errors[0]["loc"] == "model.definition"
    with pytest.raises(SpecError, match="'keras', not 'mlp'"):
        kd.check_spec_fields("mlp", "sha256:" + "a" * 64)


def test_the_data_must_fit_the_definition() -> None:
    info = kd.read_definition((EXAMPLES / "resnet20.json").read_bytes())
    kd.check_fits(info, DataInfo((32, 32, 3), "float32", (), "int32", 10, None))
    with pytest.raises(kd.DefinitionRefused, match=r"\(32, 32, 3\); the data gives \(8, 8, 1\)"):
        kd.check_fits(info, DataInfo((8, 8, 1), "float32", (), "int32", 10, None))
    with pytest.raises(kd.DefinitionRefused, match="10 units; the data has 4 classes"):
        kd.check_fits(info, DataInfo((32, 32, 3), "float32", (), "int32", 4, None))
    text = kd.read_definition((EXAMPLES / "text_classifier.json").read_bytes())
    assert kd.takes_token_ids(text) and not kd.takes_token_ids(info)
    with pytest.raises(kd.DefinitionRefused, match="store the ids as an integer array"):
        kd.check_fits(text, DataInfo((64,), "float32", (), "int32", 4, None))


def _tensor(shape: list[int | None], source: str) -> dict[str, Any]:
    return {
        "class_name": "__keras_tensor__",
        "config": {"shape": shape, "dtype": "float32", "keras_history": [source, 0, 0]},
    }


def _called(class_name: str, name: str, config: dict[str, Any], source: str, shape: Any) -> Any:
    layer = {"module": "keras.layers", "class_name": class_name, "registered_name": None}
    layer["config"] = {"name": name, **config}
    layer["inbound_nodes"] = [{"args": [_tensor(shape, source)], "kwargs": {}}]
    return layer


def repeat_vector_model(n: int, width: int = 8) -> bytes:
    """x [width] -> RepeatVector(n) -> mean over the n copies -> Dense(2), as to_json writes
    it: 3 * width + ... parameters, whatever n, and n * width values per example."""
    layers = [
        {
            "module": "keras.layers",
            "class_name": "InputLayer",
            "registered_name": None,
            "config": {"batch_shape": [None, width], "dtype": "float32", "name": "x"},
            "inbound_nodes": [],
        },
        _called("RepeatVector", "repeat", {"n": n}, "x", [None, width]),
        _called("GlobalAveragePooling1D", "pool", {}, "repeat", [None, n, width]),
        _called("Dense", "out", {"units": 2}, "pool", [None, width]),
    ]
    layers[-1]["build_config"] = {"input_shape": [None, width]}
    config = {
        "module": "keras.src.models.functional",
        "class_name": "Functional",
        "config": {
            "name": "bomb",
            "layers": layers,
            "input_layers": [["x", 0, 0]],
            "output_layers": [["out", 0, 0]],
        },
    }
    return _text(config)


def test_a_build_config_that_disagrees_with_the_graph_is_refused() -> None:
    # Keras builds a layer from build_config.input_shape first: a Dense recorded as taking
    # 7,000 features but counted from shapes_dict's 64 would be built 7,000 x 10.
    config = _resnet()
    logits = _layer(config, "logits")
    logits["build_config"] = {
        "input_shape": [None, 7000],
        "shapes_dict": {"input_shape": [None, 64]},
    }
    with pytest.raises(kd.DefinitionRefused) as refused:
        kd.read_definition(_text(config))
    assert refused.value.path == "resnet20/logits"
    assert "[None, 7000]" in str(refused.value) and "[None, 64]" in str(refused.value)
    logits["build_config"] = {"shapes_dict": {"input_shape": [None, 7000]}}
    with pytest.raises(kd.DefinitionRefused, match=r"shapes_dict\.input_shape"):
        kd.read_definition(_text(config))


def test_the_largest_activation_is_bounded_per_batch_at_the_limit() -> None:
    info = kd.read_definition(repeat_vector_model(2**28))
    assert info.parameter_count == 8 * 2 + 2  # what was all that was counted before
    assert info.largest_activation == 8 * 2**28
    assert info.largest_activation_at == "bomb/repeat"
    with pytest.raises(kd.DefinitionRefused, match="REPRO_MAX_ACTIVATION_ELEMENTS") as refused:
        kd.check_activations(info, batch_size=1, limit=2**28)
    assert refused.value.path == "bomb/repeat"
    small = kd.read_definition(repeat_vector_model(1000))
    kd.check_activations(small, batch_size=4, limit=4 * 8000)  # exactly at the limit
    with pytest.raises(kd.DefinitionRefused, match="32000 for a batch of 4"):
        kd.check_activations(small, batch_size=4, limit=4 * 8000 - 1)


def test_a_long_list_in_a_config_is_refused() -> None:
    config = _resnet()
    _layer(config, "logits")["config"]["padding"] = [0] * 600_000
    with pytest.raises(kd.DefinitionRefused, match="600000 entries"):
        kd.read_definition(_text(config))


def test_a_function_must_be_registered_under_its_own_name() -> None:
    relu = {"module": "keras.activations", "class_name": "function", "config": "relu"}
    config = _resnet()
    _layer(config, "logits")["config"]["activation"] = {**relu, "registered_name": "relu"}
    kd.read_definition(_text(config))
    _layer(config, "logits")["config"]["activation"] = {**relu, "registered_name": "mine>relu"}
    with pytest.raises(kd.DefinitionRefused, match="registered as 'mine>relu'"):
        kd.read_definition(_text(config))


@pytest.mark.parametrize("module", ["keras.src.foo", "keras.src.layers", "keras.initializers"])
def test_a_class_from_a_module_keras_does_not_write_it_under_is_refused(module: str) -> None:
    config = _resnet()
    _layer(config, "logits")["module"] = module
    with pytest.raises(kd.DefinitionRefused, match=r"Dense from module .*keras.layers") as refused:
        kd.read_definition(_text(config))
    assert refused.value.path == "resnet20/logits"


def test_token_ids_beyond_an_input_embedding_are_refused_and_other_embeddings_ignored() -> None:
    info = kd.read_definition((EXAMPLES / "text_classifier.json").read_bytes())
    assert kd.input_embeddings(info.config) == [("embedding", 1000)]
    kd.check_fits(info, DataInfo((64,), "int32", (), "int32", 4, 1000))
    with pytest.raises(kd.DefinitionRefused, match=r"looks up ids 0\.\.999 \(input_dim 1000\)"):
        kd.check_fits(info, DataInfo((64,), "int32", (), "int32", 4, 5099))
    # An Embedding of positions, fed by another layer's output, is not the data's ids.
    config = copy.deepcopy(info.config)
    positions = copy.deepcopy(_layer(config, "embedding"))
    positions["name"] = positions["config"]["name"] = "positions"
    positions["config"]["input_dim"] = 64
    positions["inbound_nodes"][0]["args"][0]["config"]["keras_history"] = ["gru", 0, 0]
    config["config"]["layers"].append(positions)
    assert kd.input_embeddings(config) == [("embedding", 1000)]
    sequential = {
        "class_name": "Sequential",
        "config": {
            "layers": [
                {"class_name": "InputLayer", "config": {"name": "ids"}},
                {"class_name": "Embedding", "config": {"name": "vocab", "input_dim": 50}},
                {"class_name": "Embedding", "config": {"name": "later", "input_dim": 7}},
            ]
        },
    }
    assert kd.input_embeddings(sequential) == [("vocab", 50)]
