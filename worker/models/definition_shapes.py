"""Output shapes of the allow-listed Keras layers, computed without TensorFlow.

Each rule is Keras's own `compute_output_shape` for that class, written out in plain Python
(shapes include the batch axis; None is an unknown size, as Keras writes it). A class
without a rule here is refused, so nothing is accepted whose activations are not known.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

Shape = tuple[int | None, ...]


class ShapeError(ValueError):
    """A layer cannot take the shapes it is given, or its config cannot be read."""


@dataclass(frozen=True)
class Tensor:
    """A Keras tensor of a call's arguments, by its shape."""

    shape: Shape


@dataclass
class Call:
    """One call of a layer: its arguments, with every Keras tensor a `Tensor`."""

    args: list[Any]
    kwargs: dict[str, Any] = field(default_factory=dict)

    def shape(self, index: int = 0, name: str | None = None) -> Shape:
        """The shape of one tensor argument (by keyword `name`, else position `index`)."""
        value = self.argument(index, name)
        if not isinstance(value, Tensor):
            raise ShapeError(f"argument {name or index} is not a tensor")
        return value.shape

    def argument(self, index: int, name: str | None = None) -> Any:
        """One argument by keyword `name`, else by position; None when not given."""
        if name is not None and name in self.kwargs:
            return self.kwargs[name]
        return self.args[index] if index < len(self.args) else None

    def shapes(self) -> list[Shape]:
        """The shapes of a list of tensors given as the first argument (merge layers)."""
        first = self.argument(0)
        if not isinstance(first, list) or not all(isinstance(t, Tensor) for t in first):
            raise ShapeError("it takes a list of tensors")
        return [t.shape for t in first]


def positive(value: Any, what: str) -> int:
    """`value` as a positive int; ShapeError otherwise."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ShapeError(f"{what} must be a positive integer, not {value!r}")
    return value


def ints(value: Any, rank: int, what: str, *, low: int = 1) -> list[int]:
    """An int or a list of `rank` ints (each at least `low`), as a list."""
    items = value if isinstance(value, list | tuple) else [value] * rank
    if len(items) != rank or not all(
        isinstance(v, int) and not isinstance(v, bool) and v >= low for v in items
    ):
        raise ShapeError(f"{what} must be {rank} integers of at least {low}, not {value!r}")
    return list(items)


def _axis(axis: Any, rank: int) -> int:
    if isinstance(axis, bool) or not isinstance(axis, int) or not -rank <= axis < rank:
        raise ShapeError(f"axis {axis!r} is outside a tensor of rank {rank}")
    return axis % rank


def elements(shape: Shape) -> int | None:
    """Values per example of a tensor (its size without the batch axis); None if unknown."""
    rest = shape[1:]
    return None if any(d is None for d in rest) else math.prod(d for d in rest if d is not None)


# --- the rules: (layer config, call) -> output shapes -------------------------------------

Rule = Callable[[dict[str, Any], Call], list[Shape]]


def _same(cfg: dict[str, Any], call: Call) -> list[Shape]:
    return [call.shape()]


def _dense(cfg: dict[str, Any], call: Call) -> list[Shape]:
    x = call.shape()
    if len(x) < 2:
        raise ShapeError(f"it takes a tensor of rank 2 or more, not {x}")
    return [(*x[:-1], positive(cfg.get("units"), "units"))]


def _embedding(cfg: dict[str, Any], call: Call) -> list[Shape]:
    return [(*call.shape(), positive(cfg.get("output_dim"), "output_dim"))]


def _spatial(cfg: dict[str, Any], x: Shape, rank: int) -> tuple[list[int | None], bool]:
    if len(x) != rank + 2:
        raise ShapeError(f"it takes a tensor of rank {rank + 2}, not {x}")
    first = cfg.get("data_format") == "channels_first"
    return list(x[2:] if first else x[1:-1]), first


def _assemble(x: Shape, spatial: list[int | None], channels: int | None, first: bool) -> Shape:
    if first:
        return (x[0], channels, *spatial)
    return (x[0], *spatial, channels)


def _conv(rank: int, kind: str) -> Rule:
    def rule(cfg: dict[str, Any], call: Call) -> list[Shape]:
        x = call.shape()
        spatial, first = _spatial(cfg, x, rank)
        kernel = ints(cfg.get("kernel_size"), rank, "kernel_size")
        strides = ints(cfg.get("strides", 1), rank, "strides")
        dilation = ints(cfg.get("dilation_rate", 1), rank, "dilation_rate")
        padding = cfg.get("padding", "valid")
        channels = x[1] if first else x[-1]
        if kind == "depthwise":
            if channels is None:
                raise ShapeError("its input channels are unknown")
            filters: int | None = channels * positive(cfg.get("depth_multiplier", 1), "depth")
        else:
            filters = positive(cfg.get("filters"), "filters")
        if kind == "transpose":
            out = _transposed(cfg, spatial, kernel, strides, dilation, padding)
        else:
            out = [_conv_length(n, k, s, d, padding) for n, k, s, d in
                   zip(spatial, kernel, strides, dilation, strict=True)]  # fmt: skip
        return [_assemble(x, out, filters, first)]

    return rule


def _conv_length(n: int | None, k: int, s: int, d: int, padding: Any) -> int | None:
    if n is None:
        return None
    if padding == "valid":
        out = (n - d * (k - 1) - 1) // s + 1
        if out <= 0:
            raise ShapeError(f"an input of size {n} is smaller than its kernel")
        return out
    if padding in ("same", "causal"):
        return (n - 1) // s + 1
    raise ShapeError(f"padding {padding!r} is not one of Keras's")


def _transposed(
    cfg: dict[str, Any],
    spatial: list[int | None],
    kernel: list[int],
    strides: list[int],
    dilation: list[int],
    padding: Any,
) -> list[int | None]:
    given = cfg.get("output_padding")
    extra = None if given is None else ints(given, len(spatial), "output_padding", low=0)
    out: list[int | None] = []
    for i, n in enumerate(spatial):
        k, s = (kernel[i] - 1) * dilation[i] + 1, strides[i]
        pad = None if extra is None else extra[i]
        if n is None:
            out.append(None)
        elif padding == "valid":
            out.append((n - 1) * s + k + (max(k, s) - k if pad is None else pad))
        elif padding == "same":
            out.append(n * s if pad is None else (n - 1) * s + k % 2 + pad)
        else:
            raise ShapeError(f"padding {padding!r} is not one of Keras's")
    return out


def _pooling(rank: int) -> Rule:
    def rule(cfg: dict[str, Any], call: Call) -> list[Shape]:
        x = call.shape()
        spatial, first = _spatial(cfg, x, rank)
        pool = ints(cfg.get("pool_size"), rank, "pool_size")
        strides = ints(cfg.get("strides") or pool, rank, "strides")
        padding = cfg.get("padding", "valid")
        out: list[int | None] = []
        for n, p, s in zip(spatial, pool, strides, strict=True):
            if n is None:
                out.append(None)
            elif padding == "valid":
                if (n - p) // s + 1 <= 0:
                    raise ShapeError(f"an input of size {n} is smaller than its pool")
                out.append((n - p) // s + 1)
            elif padding == "same":
                out.append((n - 1) // s + 1)
            else:
                raise ShapeError(f"padding {padding!r} is not one of Keras's")
        return [_assemble(x, out, x[1] if first else x[-1], first)]

    return rule


def _global_pooling(rank: int) -> Rule:
    def rule(cfg: dict[str, Any], call: Call) -> list[Shape]:
        x = call.shape()
        _, first = _spatial(cfg, x, rank)
        channels = x[1] if first else x[-1]
        if not cfg.get("keepdims"):
            return [(x[0], channels)]
        return [_assemble(x, [1] * rank, channels, first)]

    return rule


def _resized(rank: int, key: str, how: Callable[[int, Any], int]) -> Rule:
    """UpSampling (`size` per axis), ZeroPadding (`padding`) and Cropping (`cropping`)."""

    def rule(cfg: dict[str, Any], call: Call) -> list[Shape]:
        x = call.shape()
        spatial, first = _spatial(cfg, x, rank)
        values = cfg.get(key)
        per_axis = values if isinstance(values, list) and len(values) == rank else None
        if rank == 1 and key != "size":
            per_axis = [values]
        if per_axis is None:
            per_axis = [values] * rank
        out = [None if n is None else how(n, v) for n, v in zip(spatial, per_axis, strict=True)]
        if any(n is not None and n < 1 for n in out):
            raise ShapeError(f"{key} {values!r} leaves nothing of {x}")
        return [_assemble(x, out, x[1] if first else x[-1], first)]

    return rule


def _pair(value: Any, what: str) -> list[int]:
    return ints(value, 2, what, low=0)


def _upsample(n: int, size: Any) -> int:
    return n * positive(size, "size")


def _pad(n: int, pad: Any) -> int:
    return n + sum(_pair(pad, "padding"))


def _crop(n: int, crop: Any) -> int:
    return n - sum(_pair(crop, "cropping"))


def _flatten(cfg: dict[str, Any], call: Call) -> list[Shape]:
    x = call.shape()
    return [(x[0], elements(x))]


def _reshape(cfg: dict[str, Any], call: Call) -> list[Shape]:
    x, target = call.shape(), cfg.get("target_shape")
    if not isinstance(target, list) or not all(
        isinstance(d, int) and not isinstance(d, bool) and (d >= 1 or d == -1) for d in target
    ):
        raise ShapeError(f"target_shape {target!r} is not a list of sizes")
    if target.count(-1) > 1:
        raise ShapeError("target_shape has more than one -1")
    known, size = math.prod(d for d in target if d != -1), elements(x)
    if -1 in target:
        if size is None:
            return [(x[0], *(None if d == -1 else d for d in target))]
        if size % known:
            raise ShapeError(f"cannot reshape {x} to {target}")
        return [(x[0], *(size // known if d == -1 else d for d in target))]
    if size is not None and size != known:
        raise ShapeError(f"cannot reshape {x} to {target}")
    return [(x[0], *target)]


def _permute(cfg: dict[str, Any], call: Call) -> list[Shape]:
    x, dims = call.shape(), cfg.get("dims")
    if not isinstance(dims, list) or sorted(dims) != list(range(1, len(x))):
        raise ShapeError(f"dims {dims!r} is not a permutation of the axes of {x}")
    return [(x[0], *(x[d] for d in dims))]


def _repeat(cfg: dict[str, Any], call: Call) -> list[Shape]:
    x = call.shape()
    if len(x) != 2:
        raise ShapeError(f"it takes a tensor of rank 2, not {x}")
    return [(x[0], positive(cfg.get("n"), "n"), x[1])]


def _elementwise(shape1: Shape | None, shape2: Shape | None) -> Shape | None:
    """Keras's merge layers' broadcast (base_merge._compute_elemwise_op_output_shape)."""
    if shape1 is None or shape2 is None:
        return None
    if len(shape1) < len(shape2):
        return _elementwise(shape2, shape1)
    if not shape2:
        return shape1
    out = list(shape1[: -len(shape2)])
    for i, j in zip(shape1[-len(shape2) :], shape2, strict=True):
        if i is None or j is None:
            out.append(None)
        elif i == 1 or j == 1:
            out.append(j if i == 1 else i)
        elif i != j:
            raise ShapeError(f"shapes {shape1} and {shape2} do not broadcast")
        else:
            out.append(i)
    return tuple(out)


def _merge(cfg: dict[str, Any], call: Call) -> list[Shape]:
    shapes = call.shapes()
    if len(shapes) < 1:
        raise ShapeError("it takes at least one tensor")
    out: Shape | None = shapes[0][1:]
    for shape in shapes[1:]:
        out = _elementwise(out, shape[1:])
    if out is None:
        raise ShapeError("it takes tensors of known rank")
    batches = {s[0] for s in shapes} - {None}
    return [((batches.pop() if len(batches) == 1 else None), *out)]


def _concatenate(cfg: dict[str, Any], call: Call) -> list[Shape]:
    shapes = call.shapes()
    rank = len(shapes[0]) if shapes else 0
    if not shapes or any(len(s) != rank for s in shapes):
        raise ShapeError("it takes tensors of one rank")
    axis = _axis(cfg.get("axis", -1), rank)
    out: list[int | None] = list(shapes[0])
    for shape in shapes[1:]:
        for i, (a, b) in enumerate(zip(out, shape, strict=True)):
            if i == axis:
                out[i] = None if a is None or b is None else a + b
            elif a is None:
                out[i] = b
            elif b is not None and a != b:
                raise ShapeError(f"shapes {shapes} do not concatenate on axis {axis}")
    return [tuple(out)]


def _dot(cfg: dict[str, Any], call: Call) -> list[Shape]:
    shapes = call.shapes()
    if len(shapes) != 2:
        raise ShapeError("it takes two tensors")
    one, two = list(shapes[0]), list(shapes[1])
    axes = cfg.get("axes")
    pair = [axes % len(one), axes % len(two)] if isinstance(axes, int) else axes
    if not isinstance(pair, list) or len(pair) != 2:
        raise ShapeError(f"axes {axes!r} is not an axis or two")
    one.pop(_axis(pair[0], len(one)))
    two.pop(_axis(pair[1], len(two)))
    out = one + two[1:]
    return [tuple([*out, 1] if len(out) == 1 else out)]


def _recurrent(states: int) -> Rule:
    def rule(cfg: dict[str, Any], call: Call) -> list[Shape]:
        x = call.shape(0, "sequences")
        if len(x) != 3:
            raise ShapeError(f"it takes sequences of rank 3, not {x}")
        units = positive(cfg.get("units"), "units")
        out: Shape = (x[0], x[1], units) if cfg.get("return_sequences") else (x[0], units)
        return [out] + ([(x[0], units)] * states if cfg.get("return_state") else [])

    return rule


def _bidirectional(cfg: dict[str, Any], call: Call) -> list[Shape]:
    inner = cfg.get("layer")
    if not isinstance(inner, dict) or inner.get("class_name") not in _RECURRENT_STATES:
        raise ShapeError("Bidirectional wraps a GRU, LSTM or SimpleRNN")
    inner_cfg = inner.get("config") or {}
    found = _RULES[str(inner["class_name"])](inner_cfg, call)
    out, states = found[0], found[1:]
    mode = cfg.get("merge_mode", "concat")
    if mode == "concat":
        merged = [(*out[:-1], None if out[-1] is None else 2 * out[-1])]
    elif mode in ("sum", "mul", "ave"):
        merged = [out]
    elif mode is None:
        merged = [out, out]
    else:
        raise ShapeError(f"merge_mode {mode!r} is not one of Keras's")
    return merged + states + states


def _attention(cfg: dict[str, Any], call: Call) -> list[Shape]:
    query, value = call.shape(0, "query"), call.shape(1, "value")
    given = cfg.get("output_shape")
    if given is None:
        out: Shape = query
    else:
        tail = [given] if isinstance(given, int) else given
        out = (*query[:-1], *(positive(d, "output_shape") for d in tail))
    if not call.kwargs.get("return_attention_scores"):
        return [out]
    if len(query) != 3 or len(value) != 3 or cfg.get("attention_axes") not in (None, [1], [-2]):
        raise ShapeError("attention scores are known here for sequences [B, T, D] only")
    return [out, (query[0], positive(cfg.get("num_heads"), "num_heads"), query[1], value[1])]


def _broadcast(shape1: Shape, shape2: Shape) -> Shape:
    """keras.ops' numpy broadcast (operation_utils.broadcast_shapes)."""
    ones: list[int | None] = [1] * abs(len(shape1) - len(shape2))
    one = (ones if len(shape1) < len(shape2) else []) + list(shape1)
    two = (ones if len(shape2) < len(shape1) else []) + list(shape2)
    out: list[int | None] = []
    for a, b in zip(one, two, strict=True):
        if a == 1:
            out.append(b)
        elif a is None:
            out.append(None if b == 1 else b)
        elif b in (1, None, a):
            out.append(a)
        else:
            raise ShapeError(f"shapes {shape1} and {shape2} do not broadcast")
    return tuple(out)


def _operand(value: Any) -> Shape:
    if isinstance(value, Tensor):
        return value.shape
    if isinstance(value, int | float) and not isinstance(value, bool):
        return ()
    raise ShapeError(f"operand {value!r} is neither a tensor nor a number")


def _binary(cfg: dict[str, Any], call: Call) -> list[Shape]:
    return [_broadcast(_operand(call.argument(0, "x1")), _operand(call.argument(1, "x2")))]


def _reduce(cfg: dict[str, Any], call: Call) -> list[Shape]:
    x = call.shape(0, "x")
    axis, keep = cfg.get("axis"), bool(cfg.get("keepdims"))
    picked = set(range(len(x))) if axis is None else {
        _axis(a, len(x)) for a in (axis if isinstance(axis, list) else [axis])
    }  # fmt: skip
    if keep:
        return [tuple(1 if i in picked else d for i, d in enumerate(x))]
    return [tuple(d for i, d in enumerate(x) if i not in picked)]


_RECURRENT_STATES = {"SimpleRNN": 1, "GRU": 1, "LSTM": 2}
SAME_SHAPE = (
    "Activation", "ReLU", "LeakyReLU", "ELU", "Softmax", "Identity", "Rescaling",
    "Dropout", "SpatialDropout1D", "SpatialDropout2D", "SpatialDropout3D",
    "GaussianNoise", "GaussianDropout", "AlphaDropout", "UnitNormalization",
    "BatchNormalization", "LayerNormalization", "GroupNormalization",
)  # fmt: skip
_RULES: dict[str, Rule] = {
    **dict.fromkeys(SAME_SHAPE, _same),
    **dict.fromkeys(("Add", "Subtract", "Multiply", "Average", "Maximum", "Minimum"), _merge),
    "Concatenate": _concatenate,
    "Dot": _dot,
    "Dense": _dense,
    "Embedding": _embedding,
    "Flatten": _flatten,
    "Reshape": _reshape,
    "Permute": _permute,
    "RepeatVector": _repeat,
    "MultiHeadAttention": _attention,
    "Bidirectional": _bidirectional,
    **{name: _recurrent(n) for name, n in _RECURRENT_STATES.items()},
}
for _n in (1, 2, 3):
    _RULES[f"Conv{_n}D"] = _conv(_n, "conv")
    _RULES[f"Conv{_n}DTranspose"] = _conv(_n, "transpose")
    _RULES[f"MaxPooling{_n}D"] = _RULES[f"AveragePooling{_n}D"] = _pooling(_n)
    _RULES[f"GlobalMaxPooling{_n}D"] = _RULES[f"GlobalAveragePooling{_n}D"] = _global_pooling(_n)
    _RULES[f"UpSampling{_n}D"] = _resized(_n, "size", _upsample)
    _RULES[f"ZeroPadding{_n}D"] = _resized(_n, "padding", _pad)
    _RULES[f"Cropping{_n}D"] = _resized(_n, "cropping", _crop)
for _n in (1, 2):
    _RULES[f"DepthwiseConv{_n}D"] = _conv(_n, "depthwise")
    _RULES[f"SeparableConv{_n}D"] = _conv(_n, "conv")
# Keras operations recorded as layers (`+`, `*`, keras.ops.mean, ...), by class name.
_OPERATION_RULES: dict[str, Rule] = {
    **dict.fromkeys(("Add", "Subtract", "Multiply", "TrueDivide"), _binary),
    "Negative": lambda cfg, call: [call.shape(0, "x")],
    "Mean": _reduce,
    "Sum": _reduce,
}
LAYER_CLASSES = frozenset(_RULES)
OPERATION_CLASSES = frozenset(_OPERATION_RULES)


def output_shapes(
    class_name: str, cfg: dict[str, Any], call: Call, *, operation: bool
) -> list[Shape]:
    """The shapes Keras gives the outputs of one call of a layer (or operation)."""
    rules = _OPERATION_RULES if operation else _RULES
    rule = rules.get(class_name)
    if rule is None:
        raise ShapeError(f"no output shape rule for {class_name}; it is refused")
    try:
        return rule(cfg, call)
    except (TypeError, IndexError, KeyError, ZeroDivisionError) as exc:
        what = f"{type(exc).__name__}: {exc}"
        raise ShapeError(f"its config or inputs cannot be read ({what})") from None
