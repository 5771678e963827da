"""The allow-list of Keras model definitions: which classes, from which modules, under
which registered names; and the refusal every check of a definition raises.

A class is accepted only from the module Keras 3 writes it under when it serialises a model
(`keras.layers`, `keras.initializers`, ...), which is also where Keras's safe-mode loader
finds it, so nothing accepted here fails to load on a worker for a module that is not one.
"""

from __future__ import annotations

from typing import Any

MODELS = frozenset({"Functional", "Sequential"})
# Layers that hold no weights.
PARAMETER_FREE = frozenset(
    {
        "InputLayer", "Activation", "ReLU", "LeakyReLU", "ELU", "Softmax", "Identity",
        "Add", "Subtract", "Multiply", "Average", "Maximum", "Minimum", "Concatenate", "Dot",
        "Flatten", "Reshape", "Permute", "RepeatVector", "Rescaling",
        "Dropout", "SpatialDropout1D", "SpatialDropout2D", "SpatialDropout3D",
        "GaussianNoise", "GaussianDropout", "AlphaDropout",
        "MaxPooling1D", "MaxPooling2D", "MaxPooling3D",
        "AveragePooling1D", "AveragePooling2D", "AveragePooling3D",
        "GlobalAveragePooling1D", "GlobalAveragePooling2D", "GlobalAveragePooling3D",
        "GlobalMaxPooling1D", "GlobalMaxPooling2D", "GlobalMaxPooling3D",
        "ZeroPadding1D", "ZeroPadding2D", "ZeroPadding3D",
        "Cropping1D", "Cropping2D", "Cropping3D",
        "UpSampling1D", "UpSampling2D", "UpSampling3D", "UnitNormalization",
    }
)  # fmt: skip
WEIGHTED = frozenset(
    {
        "Dense", "Conv1D", "Conv2D", "Conv3D", "Conv1DTranspose", "Conv2DTranspose",
        "Conv3DTranspose", "DepthwiseConv1D", "DepthwiseConv2D", "SeparableConv1D",
        "SeparableConv2D", "BatchNormalization", "LayerNormalization", "GroupNormalization",
        "Embedding", "SimpleRNN", "GRU", "LSTM", "Bidirectional", "MultiHeadAttention",
    }
)  # fmt: skip
LAYERS = PARAMETER_FREE | WEIGHTED
# Keras operations recorded as layers when a model applies `+`, `*`, ... to tensors.
OPERATIONS = frozenset({"Add", "Subtract", "Multiply", "TrueDivide", "Negative", "Mean", "Sum"})
OPERATIONS_MODULE = "keras.src.ops.numpy"
INITIALIZERS = frozenset(
    {
        "Constant", "GlorotNormal", "GlorotUniform", "HeNormal", "HeUniform", "Identity",
        "LecunNormal", "LecunUniform", "Ones", "Orthogonal", "RandomNormal", "RandomUniform",
        "TruncatedNormal", "VarianceScaling", "Zeros",
    }
)  # fmt: skip
REGULARIZERS = frozenset({"L1", "L2", "L1L2", "OrthogonalRegularizer"})
CONSTRAINTS = frozenset({"MaxNorm", "MinMaxNorm", "NonNeg", "UnitNorm"})
DTYPE_POLICIES = frozenset({"DTypePolicy", "FloatDTypePolicy"})
# Serialization markers with no module: tensors between layers, tuples.
MARKERS = frozenset({"__keras_tensor__", "__tuple__"})
ACTIVATIONS = frozenset(
    {
        "linear", "relu", "relu6", "leaky_relu", "elu", "selu", "gelu", "silu", "swish",
        "sigmoid", "hard_sigmoid", "hard_silu", "hard_swish", "tanh", "softmax", "log_softmax",
        "softplus", "softsign", "exponential", "mish", "celu", "glu", "tanh_shrink",
        "hard_tanh", "soft_shrink", "hard_shrink", "squareplus", "sparse_plus", "log_sigmoid",
    }
)  # fmt: skip
# The module Keras writes each kind under (model.to_json()), where its loader finds it.
_KINDS = (
    (LAYERS, "keras.layers"),
    (INITIALIZERS, "keras.initializers"),  # Identity is a layer and an initializer
    (REGULARIZERS, "keras.regularizers"),
    (CONSTRAINTS, "keras.constraints"),
    (DTYPE_POLICIES, "keras"),
    (frozenset({"Functional"}), "keras.src.models.functional"),
    (frozenset({"Sequential"}), "keras"),
    (frozenset({"Sequential"}), "keras.src.models.sequential"),
)
MODULES: dict[str, frozenset[str]] = {
    name: frozenset(module for names, module in _KINDS if name in names)
    for name in frozenset().union(*(names for names, _ in _KINDS))
}
ACTIVATIONS_MODULE = "keras.activations"
# As a function object, an activation is looked up by its exported name; these two are
# aliases Keras accepts only as strings.
FUNCTIONS = ACTIVATIONS - {"swish", "hard_swish"}


class DefinitionRefused(ValueError):
    """The definition is not one this service accepts; `path` and `class_name` say where."""

    def __init__(self, message: str, *, path: str = "", class_name: str | None = None) -> None:
        where = f"{path}: " if path else ""
        what = f"{class_name}: " if class_name and class_name not in message else ""
        super().__init__(f"{where}{what}{message}")
        self.path, self.class_name = path, class_name


def allowed(class_name: str, module: str | None) -> bool:
    """Whether Keras class `class_name` from `module` is on the allow-list."""
    if class_name in MARKERS:
        return module is None
    if module == OPERATIONS_MODULE:
        return class_name in OPERATIONS
    return module in MODULES.get(class_name, frozenset())


def check_object(obj: dict[str, Any], path: str) -> None:
    """Refuse `obj`, or anything nested in it, that is not on the allow-list (a model's
    own layers excepted: they are walked as layers)."""
    check_one(obj, path)
    stack: list[tuple[Any, str]] = []
    for key, value in obj.items():
        if key == "config" and obj.get("class_name") in MODELS and isinstance(value, dict):
            stack.extend((v, f"{path}/{k}") for k, v in value.items() if k != "layers")
        else:
            stack.append((value, path if key == "config" else f"{path}/{key}"))
    while stack:
        item, where = stack.pop()
        if isinstance(item, list):
            stack.extend((v, f"{where}/{i}") for i, v in enumerate(item))
            continue
        if not isinstance(item, dict):
            continue
        if "class_name" in item:
            check_one(item, where)
            if item.get("class_name") in MODELS:
                raise DefinitionRefused("a model nested outside the layer list", path=where)
        for key, value in item.items():
            if key in ("activation", "recurrent_activation") and isinstance(value, str):
                check_activation(value, f"{where}/{key}")
            stack.append((value, where if key == "config" else f"{where}/{key}"))


def check_one(item: dict[str, Any], where: str) -> None:
    """Refuse one serialized object (not what nests in it) that is not on the allow-list."""
    class_name, module = item.get("class_name"), item.get("module")
    registered = item.get("registered_name")
    if not isinstance(class_name, str) or not (module is None or isinstance(module, str)):
        raise DefinitionRefused("class_name and module must be strings", path=where)
    if class_name in ("Lambda", "__lambda__"):
        raise DefinitionRefused(
            "Lambda layers hold Python code and are refused; use Keras layers, or push the "
            "code as a code bundle",
            path=where,
            class_name="Lambda",
        )
    if class_name == "function":
        _check_function(item, where)
        return
    if registered is not None and (not isinstance(registered, str) or registered != class_name):
        raise DefinitionRefused(
            f"registered as {registered!r}: custom objects are refused",
            path=where,
            class_name=class_name,
        )
    if not allowed(class_name, module):
        known = MODULES.get(class_name)
        hint = f"; Keras writes it under {sorted(known)}" if known else ""
        raise DefinitionRefused(
            f"{class_name} from module {module!r} is not on this service's allow-list of "
            f"Keras classes (custom objects and classes outside keras are refused){hint}",
            path=where,
            class_name=class_name,
        )


def _check_function(item: dict[str, Any], where: str) -> None:
    # Keras writes one of its activations as {"module": "keras.activations", "config": name,
    # "registered_name": name}; a registered name is what its loader looks a custom
    # function up by, so any other one is refused here rather than on the worker.
    module, name = item.get("module"), item.get("config")
    if module != ACTIVATIONS_MODULE:
        raise DefinitionRefused(
            f"a function from module {module!r} is not one of Keras's activations "
            f"(module {ACTIVATIONS_MODULE!r})",
            path=where,
            class_name="function",
        )
    if name not in FUNCTIONS:
        raise DefinitionRefused(f"activation {name!r} is not one of Keras's", path=where)
    registered = item.get("registered_name")
    if registered is not None and registered != name:
        raise DefinitionRefused(
            f"activation {name!r} registered as {registered!r}: Keras registers its own "
            "activations under their names; custom functions are refused",
            path=where,
            class_name="function",
        )


def check_activation(name: str, where: str) -> None:
    """Refuse an activation name that is not one of Keras's."""
    if name not in ACTIVATIONS:
        raise DefinitionRefused(f"activation {name!r} is not one of Keras's", path=where)
