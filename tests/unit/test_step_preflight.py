"""The step pre-flight: ops without a deterministic kernel become spec errors naming the op,
the layer that made it and the way around it.

Most of these ops raise only on a GPU; their messages are TensorFlow's own strings (from its
kernels' sources), laid out as TensorFlow reports a failed graph execution. A step that
raises on the CPU is run for real in tests/integration/test_gpu_readiness_jobs.py.
"""

from __future__ import annotations

import keras
import pytest
import tensorflow as tf

from worker.errors import SpecError
from worker.training.preflight import WORKAROUNDS, refused_op, spec_error


def _graph_error(node: str, text: str) -> str:
    """A message as TensorFlow words a failed graph execution."""
    return (
        "Graph execution error:\n\n"
        f"Detected at node {node} defined at (most recent call last):\n"
        '  File "train.py", line 40, in train_step\n\n'
        '  File "model.py", line 12, in call\n\n'
        f"{text}\n\t [[{{{{node {node}}}}}]] [Op:__inference_train_step_412]"
    )


# (op, layer that makes it, node name TensorFlow gives it, TensorFlow's message)
RECORDED = [
    (
        "ResizeNearestNeighborGrad",
        "resizing",
        "gradient_tape/functional_1/resizing_1/resize/ResizeNearestNeighborGrad",
        "A deterministic GPU implementation of ResizeNearestNeighborGrad is not currently "
        "available.",
    ),
    (
        "FusedBatchNormGrad",
        "batch_normalization",
        "gradient_tape/functional_1/batch_normalization_1/FusedBatchNormGradV3",
        "A deterministic GPU implementation of fused batch-norm backprop, when training is "
        "disabled, is not currently available.",
    ),
    (
        "CropAndResizeBackpropImage",
        "crop",
        "gradient_tape/functional_1/crop_1/CropAndResize/CropAndResizeGradImage",
        "Deterministic GPU implementation of CropAndResizeBackpropImage not available.",
    ),
    (
        "CropAndResizeBackpropBoxes",
        "crop",
        "gradient_tape/functional_1/crop_1/CropAndResize/CropAndResizeGradBoxes",
        "Deterministic GPU implementation of CropAndResizeBackpropBoxes not available.",
    ),
    (
        "AdjustContrastv2",
        "contrast",
        "functional_1/contrast_1/adjust_contrast/AdjustContrastv2",
        "A deterministic GPU implementation of AdjustContrastv2 is not currently available.",
    ),
    (
        "SparseTensorDenseMatmul",
        "sparse_dense",
        "functional_1/sparse_dense_1/SparseTensorDenseMatMul/SparseTensorDenseMatMul",
        "A deterministic GPU implementation of SparseTensorDenseMatmulOp is not currently "
        "available.",
    ),
    (
        "Bincount",
        "counts",
        "functional_1/counts_1/bincount/Bincount",
        "Determinism is not yet supported in GPU implementation of Bincount.",
    ),
    (
        "Bincount",
        "counts",
        "functional_1/counts_1/bincount/DenseBincount",
        "Determinism is not yet supported in GPU implementation of DenseBincount.",
    ),
]


def _model() -> keras.Model:
    """A model with layers named as the recorded nodes' scopes (no weights are trained)."""
    inputs = keras.Input((8, 8, 3), name="images")
    h = keras.layers.Resizing(16, 16, interpolation="nearest", name="resizing")(inputs)
    h = keras.layers.BatchNormalization(name="batch_normalization")(h)
    for name in ("crop", "contrast", "sparse_dense", "counts"):
        h = keras.layers.Identity(name=name)(h)
    return keras.Model(inputs, keras.layers.Flatten(name="flatten")(h))


@pytest.mark.parametrize(("op", "layer", "node", "text"), RECORDED, ids=[r[2] for r in RECORDED])
def test_each_refused_op_becomes_a_spec_error_naming_op_layer_and_way_around(
    op: str, layer: str, node: str, text: str
) -> None:
    raised = tf.errors.UnimplementedError(None, None, _graph_error(node, text))
    error = spec_error(raised.message, model=_model(), which="training")
    assert isinstance(error, SpecError)
    message = str(error)
    assert f"runs {op}," in message
    assert f"layer {layer!r}" in message
    assert WORKAROUNDS[op] in message
    assert "model.py:12 in call" in message  # where the user's code made the op
    assert error.errors == [{"loc": "model", "msg": message}]


def test_an_eager_message_without_a_node_still_names_the_op() -> None:
    # How TensorFlow words it when the op runs eagerly (no graph node, no layer scope).
    text = (
        "{{function_node __wrapped__AdjustContrastv2_device_/job:localhost/replica:0/task:0/"
        "device:GPU:0}} A deterministic GPU implementation of AdjustContrastv2 is not currently"
        " available. [Op:AdjustContrastv2] name: "
    )
    refused = refused_op(text)
    assert refused is not None and refused.op == "AdjustContrastv2"
    error = spec_error(text, model=_model(), which="evaluation")
    assert error is not None
    assert "evaluation step runs AdjustContrastv2" in str(error)
    assert "outside any named layer" in str(error)


def test_other_errors_are_not_taken_for_refused_ops() -> None:
    assert refused_op("Matrix size-incompatible: In[0]: [2,3], In[1]: [4,5]") is None
    assert spec_error("Incompatible shapes: [2] vs. [3]", model=_model(), which="training") is None
