"""Output shapes of the allow-listed Keras layers, computed without TensorFlow.

Each rule is Keras's own `compute_output_shape` for that class, written out in plain Python
(shapes include the batch axis; None is an unknown size, as Keras writes it). A class
without a rule here is refused, so nothing is accepted whose activations are not known.
"""

from __future__ import annotations

import math
from typing import Any

from worker.models.definition_spatial_shapes import spatial_rules
from worker.models.definition_tensors import (
    Call,
    Rule,
    Shape,
    ShapeError,
    Tensor,
    axis_index,
    elements,
    positive,
)

__all__ = ["Call", "Shape", "ShapeError", "Tensor", "elements", "output_shapes"]

# --- the rules: (layer config, call) -> output shapes -------------------------------------


def _same(cfg: dict[str, Any], call: Call) -> list[Shape]:
    return [call.shape()]


def _dense(cfg: dict[str, Any], call: Call) -> list[Shape]:
    x = call.shape()
    if len(x) < 2:
        raise ShapeError(f"it takes a tensor of rank 2 or more, not {x}")
    return [(*x[:-1], positive(cfg.get("units"), "units"))]


def _embedding(cfg: dict[str, Any], call: Call) -> list[Shape]:
    return [(*call.shape(), positive(cfg.get("output_dim"), "output_dim"))]


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
    axis = axis_index(cfg.get("axis", -1), rank)
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
    one.pop(axis_index(pair[0], len(one)))
    two.pop(axis_index(pair[1], len(two)))
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
        axis_index(a, len(x)) for a in (axis if isinstance(axis, list) else [axis])
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
_RULES.update(spatial_rules())
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
