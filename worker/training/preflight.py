"""The step pre-flight: run the training and evaluation steps once, before the first epoch,
and turn an op that has no deterministic kernel into a spec error that names it.

Under op determinism TensorFlow refuses such an op only when a kernel first runs it (on a
GPU mostly, where several ops only have nondeterministic kernels), which without this check
is a traceback minutes or hours into a job with no layer named. The pre-flight runs one
step on the first batch on the devices the job uses and puts every variable back, so the
run trains exactly as it would have without it.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from worker.errors import SpecError

# Documented ways around each op TensorFlow refuses under op determinism, keyed by the op
# type its message names. The messages are TensorFlow's own (see `refused_op`).
WORKAROUNDS: dict[str, str] = {
    "ResizeNearestNeighborGrad": (
        "resize with interpolation='bilinear', or enlarge by whole factors with "
        "keras.layers.UpSampling2D (it repeats rows and columns, whose gradient is a "
        "deterministic sum) instead of Resizing or tf.image.resize with 'nearest'"
    ),
    "FusedBatchNormGrad": (
        "the gradient flows through a BatchNormalization layer called with training=False "
        "(a frozen one): freeze every layer before it too so no gradient reaches it, call it "
        "with training=True, or use LayerNormalization or GroupNormalization"
    ),
    "CropAndResizeBackpropImage": (
        "stop the gradient at the image (tf.stop_gradient) before tf.image.crop_and_resize, "
        "or crop with tf.slice / tf.gather and resize with tf.image.resize"
    ),
    "CropAndResizeBackpropBoxes": (
        "stop the gradient at the boxes (tf.stop_gradient) before tf.image.crop_and_resize"
    ),
    "AdjustContrastv2": (
        "adjust contrast in the data generator, or write it as (x - mean) * factor + mean "
        "with tf.reduce_mean over height and width"
    ),
    "SparseTensorDenseMatmul": (
        "multiply tf.sparse.to_dense(a) with tf.matmul, or look rows up with "
        "tf.nn.embedding_lookup_sparse"
    ),
    "Bincount": (
        "count with tf.math.unsorted_segment_sum(tf.ones_like(x), x, num_bins), or "
        "tf.reduce_sum(tf.one_hot(x, num_bins), axis=0)"
    ),
    "SoftmaxCrossEntropyWithLogits": (
        "use a loss built from tf.nn.log_softmax (Keras's categorical_crossentropy with "
        "from_logits=True computes it that way)"
    ),
    "DepthwiseConvBackpropFilter": (
        "use a Conv2D with groups equal to the input channels instead of DepthwiseConv2D"
    ),
    "Timestamp": (
        "read the time in Python outside the compiled step: a timestamp inside it makes "
        "every run differ"
    ),
}

# TensorFlow's messages (its kernels' sources), most specific first: (pattern, op), where a
# None op is the pattern's first group.
_MESSAGES: tuple[tuple[re.Pattern[str], str | None], ...] = (
    (
        re.compile(r"deterministic GPU implementation of fused batch-norm backprop"),
        "FusedBatchNormGrad",
    ),
    (re.compile(r"[Dd]eterministic GPU implementation of (\w+)"), None),
    (re.compile(r"Determinism is not yet supported in GPU implementation of (\w+)"), None),
    (re.compile(r"(Timestamp) cannot be called when determinism is enabled"), None),
)
_OP_ALIASES = {
    "SparseTensorDenseMatmulOp": "SparseTensorDenseMatmul",
    "DenseBincount": "Bincount",
    "FusedBatchNormGradV3": "FusedBatchNormGrad",
    "FusedBatchNormGradV2": "FusedBatchNormGrad",
}
_NODE = re.compile(r"\{\{node ([^}]+)\}\}")
_DETECTED = re.compile(r"Detected at node '?([^' \n]+)'? defined at")
_FRAME = re.compile(r'^\s*File "([^"]+)", line (\d+), in (\S+)', re.MULTILINE)
_TRAILING_COUNTER = re.compile(r"_\d+$")


@dataclass(frozen=True)
class RefusedOp:
    """An op TensorFlow refused to run under op determinism, as read from its message."""

    op: str
    node: str | None  # the graph node's full name, when the message gives it
    defined_at: str | None  # "file:line in function" of the innermost frame that made it


def refused_op(message: str) -> RefusedOp | None:
    """The op a TensorFlow error message says has no deterministic kernel, or None."""
    op: str | None = None
    for pattern, fixed in _MESSAGES:
        found = pattern.search(message)
        if found:
            op = fixed or found.group(1)
            break
    if op is None:
        return None
    node = _NODE.search(message) or _DETECTED.search(message)
    frames = _FRAME.findall(message.split("Detected at node", 1)[-1])
    where = f"{frames[-1][0]}:{frames[-1][1]} in {frames[-1][2]}" if frames else None
    return RefusedOp(
        op=_OP_ALIASES.get(op, op), node=node.group(1) if node else None, defined_at=where
    )


def layer_of_node(node: str | None, layer_names: Iterable[str]) -> str | None:
    """The innermost layer whose name scope the node was made in, or None.

    Keras scopes a node by model and layer name, and TensorFlow adds a `_N` counter when a
    scope name repeats (`functional_1/clock_1/Timestamp` for the layer `clock`).
    """
    if not node:
        return None
    names = set(layer_names)
    for part in reversed(node.split("/")[:-1]):
        for candidate in (part, _TRAILING_COUNTER.sub("", part)):
            if candidate in names:
                return candidate
    return None


def _layer_names(model: Any) -> list[str]:
    names: list[str] = []
    pending = list(getattr(model, "layers", []))
    while pending:
        layer = pending.pop()
        names.append(str(layer.name))
        pending += list(getattr(layer, "layers", []))  # nested models and wrappers
    return names


def spec_error(message: str, *, model: Any, which: str) -> SpecError | None:
    """The SpecError for a refused op in the `which` ("training" or "evaluation") step."""
    refused = refused_op(message)
    if refused is None:
        return None
    layer = layer_of_node(refused.node, _layer_names(model))
    where = f"layer {layer!r}" if layer else "a part of the step outside any named layer"
    made = f" (made at {refused.defined_at})" if refused.defined_at else ""
    around = WORKAROUNDS.get(
        refused.op,
        "replace the op, or set determinism.op_determinism to false and accept that runs "
        "may differ",
    )
    msg = (
        f"the {which} step runs {refused.op}, which has no deterministic kernel on this "
        f"device under op determinism, in {where}{made}; {around}"
    )
    return SpecError(msg, errors=[{"loc": "model", "msg": msg}])


def run_steps(
    *, model: Any, variables: list[Any], steps: list[tuple[str, Callable[[], Any]]]
) -> None:
    """Call each (name, call) once, then put `variables` back as they were; an op refused
    under op determinism raises SpecError naming it and its layer."""
    import tensorflow as tf

    saved = [v.numpy() for v in variables]
    try:
        for which, call in steps:
            try:
                call()
            except (tf.errors.UnimplementedError, tf.errors.FailedPreconditionError) as exc:
                error = spec_error(str(exc.message), model=model, which=which)
                if error is None:
                    raise
                raise error from None
    finally:
        for variable, value in zip(variables, saved, strict=True):
            variable.assign(value)


def check_steps(job: Any) -> None:
    """Run the job's training function (the one its epochs call) and evaluation step once
    on their first batch, restoring every variable (model, optimizer, metrics) after; a
    refused op raises SpecError."""
    from worker.training.step_loop import xy

    variables = [v for _, v in job.state]
    for metric in job.train_metrics + job.eval_metrics:
        variables += list(metric.variables)
    steps: list[tuple[str, Callable[[], Any]]] = [("training", job.first_training_call())]
    if job.eval_data is not None:
        x, y = xy(job.eval_data.make_batch(0), job.eval_data.name)
        steps.append(("evaluation", lambda: job.eval_step(x, y)))
    run_steps(model=job.model, variables=variables, steps=steps)
