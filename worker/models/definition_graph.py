"""A definition's tensors, followed from the model's input through every layer call.

Functional models are followed by their `inbound_nodes` (each argument's `keras_history`
names the layer, call and output it comes from), Sequential ones in order, nested models
as layers. Each call's output shapes come from Keras's own rules (definition_shapes); each
layer's parameters are counted from the shapes of its first call, and a layer whose
recorded `build_config` (what Keras builds it from when loading) says anything else is
refused, so the count is what Keras allocates. Every tensor's size is seen on the way, so
the largest activation is known too.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

from worker.models.definition_allow_list import MODELS, OPERATIONS_MODULE, DefinitionRefused
from worker.models.definition_params import count
from worker.models.definition_shapes import Call, Shape, ShapeError, Tensor, elements
from worker.models.definition_shapes import output_shapes as rule_output_shapes

Ref = tuple[str, int, int]  # (layer name, call index, output index): a Keras history
# The names of each class's call arguments by position, for `build_config.shapes_dict`.
_ARGUMENTS = {
    "MultiHeadAttention": ("query", "value", "key"),
    **dict.fromkeys(("GRU", "LSTM", "SimpleRNN", "Bidirectional"), ("sequences", "initial_state")),
}


def config_sha256(config: Any) -> str:
    """SHA-256 of a config's canonical JSON (keys sorted, no spaces)."""
    text = json.dumps(config, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


@dataclass(frozen=True)
class LayerInfo:
    """One layer as the checker found it."""

    path: str  # model name / nested model names / layer name
    class_name: str
    parameters: int
    config_sha256: str  # of the layer's canonical config, to say which layers differ
    # The shapes of its first call (batch axis first, None unknown), as Keras builds it.
    input_shapes: tuple[Shape, ...] = ()
    output_shapes: tuple[Shape, ...] = ()

    def as_record(self) -> dict[str, Any]:
        """JSON-ready form, as stored and shown."""
        return {
            "path": self.path,
            "class_name": self.class_name,
            "parameters": self.parameters,
            "config_sha256": self.config_sha256,
        }


def shape_of(value: Any, what: str, path: str) -> Shape:
    """A JSON shape (a list of sizes and nulls) as a Shape; DefinitionRefused otherwise."""
    if not isinstance(value, list) or not all(
        d is None or (isinstance(d, int) and not isinstance(d, bool) and d >= 0) for d in value
    ):
        raise DefinitionRefused(f"{what} {value!r} is not a shape", path=path)
    return tuple(value)


def _structure(value: Any) -> Any:
    """A call argument's shapes as Keras records them in build_config (nested lists)."""
    if isinstance(value, Tensor):
        return list(value.shape)
    if isinstance(value, list):
        return [_structure(v) for v in value]
    return value


class Propagation:
    """One walk of a model's tensors; with `check`, also its layers' counts and builds."""

    def __init__(self, *, max_calls: int) -> None:
        self.max_calls, self.calls = max_calls, 0
        self.largest, self.largest_at, self.unknown = 0, "", False

    def see(self, shapes: list[Shape], path: str) -> None:
        """Note the sizes of tensors `path` makes."""
        for shape in shapes:
            size = elements(shape)
            if size is None:
                self.unknown = True
            elif size > self.largest:
                self.largest, self.largest_at = size, path

    def model(
        self, config: dict[str, Any], parent: str, inputs: list[Shape] | None, *, check: bool
    ) -> tuple[list[Shape], list[LayerInfo]]:
        """The model's output shapes given `inputs` (None: the inputs it declares), and,
        with `check`, its layers checked and counted, in the order the config lists them."""
        inner = config.get("config")
        if not isinstance(inner, dict) or not isinstance(inner.get("layers"), list):
            raise DefinitionRefused("a model config lists its layers", path=parent or "model")
        name = inner.get("name")
        path = f"{parent}/{name}" if parent else str(name or "model")
        if config.get("class_name") == "Sequential":
            return self._sequential(inner, path, inputs, check=check)
        return _Functional(self, inner, path, check=check).run(inputs)

    def _sequential(
        self, inner: dict[str, Any], path: str, inputs: list[Shape] | None, *, check: bool
    ) -> tuple[list[Shape], list[LayerInfo]]:
        layers: list[Any] = inner["layers"]
        infos: list[LayerInfo] = []
        first = layers[0] if layers and isinstance(layers[0], dict) else {}
        if first.get("class_name") == "InputLayer":
            declared = input_layer_shape(first, path)
            layers = layers[1:]
            if check:
                infos.append(_input_info(first, f"{path}/{_name(first, 0)}", declared))
        elif inner.get("build_input_shape") is not None:
            declared = shape_of(inner.get("build_input_shape"), "build_input_shape", path)
        else:
            raise DefinitionRefused(
                "the model records no input shape: build it from keras.Input(...)", path=path
            )
        x = _given(inputs, [declared], path)[0]
        self.see([x], path)
        for index, layer in enumerate(layers, start=1):
            if not isinstance(layer, dict) or layer.get("class_name") == "InputLayer":
                raise DefinitionRefused(f"layer {index} is not a layer after the input", path=path)
            outs, found = self.call(layer, Call([Tensor(x)]), path, index, check=check)
            infos.extend(found)
            if len(outs) != 1:
                raise DefinitionRefused(
                    "a Sequential model's layers each make one tensor", path=f"{path}/{index}"
                )
            x = outs[0]
        return [x], infos

    def call(
        self, layer: dict[str, Any], call: Call, parent: str, index: int, *, check: bool
    ) -> tuple[list[Shape], list[LayerInfo]]:
        """One call of a layer (or nested model): its outputs, and with `check` its infos."""
        self.calls += 1
        if self.calls > self.max_calls:
            raise DefinitionRefused(
                f"more than {self.max_calls} layer calls (twice REPRO_MAX_MODEL_DEFINITION_LAYERS)",
                path=parent,
            )
        class_name = str(layer.get("class_name"))
        if class_name in MODELS:
            return self._nested(layer, call, parent, check=check)
        path = f"{parent}/{_name(layer, index)}"
        cfg = layer.get("config")
        if not isinstance(cfg, dict):
            raise DefinitionRefused("a layer's config is an object", path=path)
        operation = layer.get("module") == OPERATIONS_MODULE
        try:
            outs = rule_output_shapes(class_name, cfg, call, operation=operation)
        except ShapeError as exc:
            raise DefinitionRefused(str(exc), path=path, class_name=class_name) from None
        self.see(outs, path)
        if not check:
            return outs, []
        _check_build(layer, call, path)
        parameters = count(layer, call, path, operation=operation)
        inputs = tuple(t.shape for t in _tensors(call))
        info = LayerInfo(
            path, class_name, parameters, config_sha256(cfg), inputs, tuple(tuple(o) for o in outs)
        )
        return outs, [info]

    def _nested(
        self, layer: dict[str, Any], call: Call, parent: str, *, check: bool
    ) -> tuple[list[Shape], list[LayerInfo]]:
        given = call.argument(0)
        tensors = given if isinstance(given, list) else [given]
        if not all(isinstance(t, Tensor) for t in tensors):
            raise DefinitionRefused("a nested model is called on tensors", path=parent)
        actual = [t.shape for t in tensors]
        if not check:
            return self.model(layer, parent, actual, check=False)
        # Its layers were built, and are counted, from the inputs it declares; what it
        # makes from the tensors it is called on is what the caller's layers take.
        infos = self.model(layer, parent, None, check=True)[1]
        return self.model(layer, parent, actual, check=False)[0], infos


@dataclass
class _Pending:
    """A layer's calls, of which `done` are made."""

    name: str
    layer: dict[str, Any]
    nodes: list[Any]
    index: int
    done: int = 0


class _Functional:
    """A Functional model's graph, followed call by call."""

    def __init__(self, walk: Propagation, inner: dict[str, Any], path: str, *, check: bool) -> None:
        self.walk, self.inner, self.path, self.check = walk, inner, path, check
        self.tensors: dict[Ref, Shape] = {}
        self.layers: list[tuple[str, dict[str, Any]]] = []
        for index, layer in enumerate(inner["layers"]):
            if not isinstance(layer, dict):
                raise DefinitionRefused(f"layer {index} is not an object", path=path)
            name = _name(layer, index)
            if any(name == known for known, _ in self.layers):
                raise DefinitionRefused(f"two layers are named {name!r}", path=path)
            self.layers.append((name, layer))

    def run(self, inputs: list[Shape] | None) -> tuple[list[Shape], list[LayerInfo]]:
        """The outputs, and the layers' infos in config order."""
        by_name = dict(self.layers)
        refs = _refs(self.inner.get("input_layers"), "input_layers", self.path)
        declared = []
        for name, node, _ in refs:
            layer = by_name.get(name, {})
            if layer.get("class_name") != "InputLayer" or node != 0:
                raise DefinitionRefused(f"input {name!r} is not an InputLayer", path=self.path)
            declared.append(input_layer_shape(layer, f"{self.path}/{name}"))
        shapes = _given(inputs, declared, self.path)
        for ref, shape in zip(refs, shapes, strict=True):
            self.tensors[ref] = shape
        self.walk.see(shapes, self.path)
        infos = self._calls()
        for name, layer in self.layers:
            if layer.get("class_name") == "InputLayer" and self.check:
                taken = self.tensors.get((name, 0, 0))
                if taken is None:
                    raise DefinitionRefused("an InputLayer the model does not take", path=name)
                infos[name] = [_input_info(layer, f"{self.path}/{name}", taken)]
        outs = [self._tensor(ref) for ref in _refs(self.inner.get("output_layers"), "", self.path)]
        return outs, [info for name, _ in self.layers for info in infos.get(name, [])]

    def _calls(self) -> dict[str, list[LayerInfo]]:
        """Every layer call, each once its arguments exist (Keras's order when loading)."""
        pending: list[_Pending] = []
        for index, (name, layer) in enumerate(self.layers):
            nodes = layer.get("inbound_nodes")
            if not isinstance(nodes, list):
                raise DefinitionRefused("inbound_nodes is not a list", path=f"{self.path}/{name}")
            if (layer.get("class_name") == "InputLayer") != (not nodes):
                raise DefinitionRefused(
                    "every layer but an InputLayer is called in the model's graph",
                    path=f"{self.path}/{name}",
                )
            if nodes:
                pending.append(_Pending(name, layer, nodes, index))
        infos: dict[str, list[LayerInfo]] = {}
        progress = True
        while pending and progress:
            progress = False
            for item in pending:
                while item.done < len(item.nodes):
                    call = self._arguments(item.nodes[item.done], f"{self.path}/{item.name}")
                    if call is None:
                        break
                    first = item.done == 0
                    outs, found = self.walk.call(
                        item.layer, call, self.path, item.index, check=self.check and first
                    )
                    infos.setdefault(item.name, []).extend(found)
                    for i, shape in enumerate(outs):
                        self.tensors[(item.name, item.done, i)] = shape
                    item.done, progress = item.done + 1, True
            pending = [item for item in pending if item.done < len(item.nodes)]
        if pending:
            raise DefinitionRefused(
                "its inputs are never made in the model's graph",
                path=f"{self.path}/{pending[0].name}",
            )
        return infos

    def _arguments(self, node: Any, path: str) -> Call | None:
        """The node's call with every Keras tensor resolved; None until they all exist."""
        if not isinstance(node, dict) or not isinstance(node.get("args"), list):
            raise DefinitionRefused(
                "a layer call is not in Keras 3's format ({'args': [...], 'kwargs': {...}}); "
                "save the model with Keras 3",
                path=path,
            )
        missing = False

        def resolve(value: Any) -> Any:
            nonlocal missing
            if isinstance(value, list):
                return [resolve(v) for v in value]
            if isinstance(value, dict) and value.get("class_name") == "__keras_tensor__":
                ref = _ref((value.get("config") or {}).get("keras_history"), path)
                if ref not in self.tensors:
                    missing = True
                    return None
                return Tensor(self.tensors[ref])
            if isinstance(value, dict):
                return {k: resolve(v) for k, v in value.items()}
            return value

        kwargs = node.get("kwargs") or {}
        if not isinstance(kwargs, dict):
            raise DefinitionRefused("a layer call's kwargs are not an object", path=path)
        call = Call(resolve(node["args"]), resolve(kwargs))
        return None if missing else call

    def _tensor(self, ref: Ref) -> Shape:
        if ref not in self.tensors:
            raise DefinitionRefused(f"output {list(ref)} is not made in the graph", path=self.path)
        return self.tensors[ref]


def input_layer_shape(layer: dict[str, Any], path: str) -> Shape:
    """An InputLayer's shape, batch axis first."""
    cfg = layer.get("config") or {}
    value = cfg.get("batch_shape") or cfg.get("batch_input_shape")
    if not value:
        raise DefinitionRefused(
            "the model records no input shape: build it from keras.Input(...)", path=path
        )
    return shape_of(value, "batch_shape", path)


def _input_info(layer: dict[str, Any], path: str, shape: Shape) -> LayerInfo:
    return LayerInfo(path, "InputLayer", 0, config_sha256(layer.get("config")), (), (shape,))


def _name(layer: dict[str, Any], index: int) -> str:
    cfg = layer.get("config")
    name = cfg.get("name") if isinstance(cfg, dict) else None
    return str(name if name else layer.get("name") or index)


def _given(inputs: list[Shape] | None, declared: list[Shape], path: str) -> list[Shape]:
    """The shapes a model is called with, each compatible with the one it declares."""
    if inputs is None:
        return declared
    if len(inputs) != len(declared) or any(
        len(a) != len(d) or any(w is not None and w != g for w, g in zip(d, a, strict=True))
        for a, d in zip(inputs, declared, strict=True)
    ):
        raise DefinitionRefused(
            f"called on {[list(s) for s in inputs]}; it takes {[list(s) for s in declared]}",
            path=path,
        )
    return inputs


def _ref(value: Any, path: str) -> Ref:
    if (
        not isinstance(value, list)
        or len(value) != 3
        or not isinstance(value[0], str)
        or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in value[1:])
    ):
        raise DefinitionRefused(f"{value!r} is not a tensor's [layer, call, output]", path=path)
    return value[0], value[1], value[2]


def _refs(value: Any, what: str, path: str) -> list[Ref]:
    if isinstance(value, list) and value and isinstance(value[0], str):
        value = [value]  # one tensor, written without the enclosing list
    if not isinstance(value, list) or not value:
        raise DefinitionRefused(f"the model lists no {what or 'output_layers'}", path=path)
    return [_ref(v, path) for v in value]


def _tensors(call: Call) -> list[Tensor]:
    found: list[Tensor] = []
    stack: list[Any] = [call.args, list(call.kwargs.values())]
    while stack:
        item = stack.pop()
        if isinstance(item, Tensor):
            found.append(item)
        elif isinstance(item, list):
            stack.extend(reversed(item))
    return found


def _check_build(layer: dict[str, Any], call: Call, path: str) -> None:
    """Refuse a `build_config` that says anything but the shapes the layer is called with:
    Keras builds (allocates) the layer from it when loading, before any call."""
    build = layer.get("build_config")
    if build is None:
        return
    if not isinstance(build, dict):
        raise DefinitionRefused("build_config is not an object", path=path)
    class_name = str(layer.get("class_name"))
    names = _ARGUMENTS.get(class_name, ("inputs",))
    recorded: list[tuple[str, Any, Any]] = []
    if "input_shape" in build:
        recorded.append(("input_shape", build["input_shape"], _structure(call.argument(0))))
    shapes = build.get("shapes_dict")
    if shapes is not None:
        if not isinstance(shapes, dict):
            raise DefinitionRefused("build_config.shapes_dict is not an object", path=path)
        for key, value in shapes.items():
            name = key.removesuffix("_shape")
            # `build(**shapes_dict)`: "input_shape" is build's own first parameter.
            position = 0 if name == "input" else names.index(name) if name in names else 99
            given = call.argument(position, name) if key.endswith("_shape") else None
            if given is None:
                raise DefinitionRefused(
                    f"build_config.shapes_dict names {key!r}, which the layer's call does not give",
                    path=path,
                    class_name=class_name,
                )
            recorded.append((f"shapes_dict.{key}", value, _structure(given)))
    for field, value, propagated in recorded:
        if value != propagated:
            raise DefinitionRefused(
                f"build_config.{field} is {value!r} but the layer is called on {propagated!r}: "
                "Keras would build it from the recorded shape, so it is refused",
                path=path,
                class_name=class_name,
            )
