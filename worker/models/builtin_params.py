"""Parameter models of the built-in generators and architectures (TensorFlow-free).

They live apart from the TensorFlow code so the API can reject bad params at submission.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field


class _Params(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


Dim = Annotated[int, Field(ge=1, le=65_536)]
MAX_VOCAB_SIZE = 1_000_000  # token ids a vocabulary may hold (an embedding row each)


class GaussianBlobsParams(_Params):
    """Classes are Gaussian clusters around fixed centres; `center_scale: 0` is pure noise."""

    num_features: Dim = 16
    num_classes: Annotated[int, Field(ge=2, le=10_000)] = 4
    spread: Annotated[float, Field(gt=0)] = 1.0
    center_scale: Annotated[float, Field(ge=0)] = 4.0
    # The centres are part of the task, not of the run: fixed by this, not by the run seed.
    centers_seed: Annotated[int, Field(ge=0)] = 0


class RegressionParams(_Params):
    num_features: Dim = 8
    targets: Annotated[int, Field(ge=1, le=1024)] = 1
    noise: Annotated[float, Field(ge=0)] = 0.1
    weights_seed: Annotated[int, Field(ge=0)] = 0


class PatternImagesParams(_Params):
    """Noisy stripe/ring images; the class is the pattern's orientation."""

    image_size: Annotated[int, Field(ge=4, le=512)] = 16
    channels: Annotated[int, Field(ge=1, le=4)] = 1
    num_classes: Annotated[int, Field(ge=2, le=4)] = 4
    noise: Annotated[float, Field(ge=0)] = 0.3


class TokenSequencesParams(_Params):
    """Integer token sequences; the label is the class whose tokens occur most often."""

    vocab_size: Annotated[int, Field(ge=4, le=MAX_VOCAB_SIZE)] = 32
    seq_len: Annotated[int, Field(ge=2, le=4096)] = 16
    num_classes: Annotated[int, Field(ge=2, le=64)] = 2


class MLPParams(_Params):
    hidden: Annotated[list[Dim], Field(max_length=32)] = Field(default_factory=lambda: [64])
    activation: Literal["relu", "gelu", "tanh", "sigmoid", "elu", "selu", "swish"] = "relu"
    dropout: Annotated[float, Field(ge=0, lt=1)] = 0.0
    batch_norm: bool = False


class SmallCNNParams(_Params):
    filters: Annotated[list[Dim], Field(min_length=1, max_length=8)] = Field(
        default_factory=lambda: [16, 32]
    )
    kernel_size: Annotated[int, Field(ge=1, le=11)] = 3
    dropout: Annotated[float, Field(ge=0, lt=1)] = 0.25
    dense: Annotated[int, Field(ge=0, le=65_536)] = 64


class TinyTransformerParams(_Params):
    embed_dim: Annotated[int, Field(ge=2, le=4096)] = 32
    num_heads: Annotated[int, Field(ge=1, le=64)] = 2
    ff_dim: Annotated[int, Field(ge=1, le=16_384)] = 64
    num_blocks: Annotated[int, Field(ge=1, le=12)] = 1
    dropout: Annotated[float, Field(ge=0, lt=1)] = 0.1


class GRUParams(_Params):
    embed_dim: Annotated[int, Field(ge=2, le=4096)] = 32
    units: Annotated[int, Field(ge=1, le=4096)] = 32
    dropout: Annotated[float, Field(ge=0, lt=1)] = 0.0


class ArraysParams(_Params):
    """Samples from a stored dataset (spec `dataset.data`): rows of the arrays `x` and `y`.

    A fraction of the rows is held out for evaluation by a stateless split keyed by
    `split_seed` (part of the task, like a dataset's test split: runs with other seeds
    evaluate on the same rows). Training rows are shuffled per epoch by a stateless
    permutation; augmentation applies to training batches only, keyed by the batch seed.
    """

    x: str = Field(default="x", min_length=1, max_length=200)
    y: str = Field(default="y", min_length=1, max_length=200)
    # None: integer labels are classes 0..max(y); float labels are regression targets.
    num_classes: Annotated[int, Field(ge=2, le=1_000_000)] | None = None
    eval_fraction: Annotated[float, Field(ge=0, lt=1)] = 0.0
    split_seed: Annotated[int, Field(ge=0)] = 0
    shuffle: bool = True
    # Integer x stays integer (int32 token ids) when the architecture takes token ids or
    # `x_dtype` is "int32"; "float32" converts it whatever the architecture. None: decided by
    # the architecture. Unset (None) leaves existing specs' hashes as they were.
    x_dtype: Literal["float32", "int32"] | None = None
    # Token ids run over 0..vocab_size-1; None: the dataset's largest id + 1.
    vocab_size: Annotated[int, Field(ge=2, le=MAX_VOCAB_SIZE)] | None = None
    # Float x becomes float32 x * scale + offset (e.g. scale 1/255 for uint8 pixels).
    scale: float = 1.0
    offset: float = 0.0
    # Augmentation of training images [H, W, C], each sample drawn independently.
    flip_left_right: bool = False
    crop_padding: Annotated[int, Field(ge=0, le=256)] = 0  # pad, then crop back at random
    brightness: Annotated[float, Field(ge=0)] = 0.0  # add U(-b, b)
    contrast: Annotated[float, Field(ge=0, lt=1)] = 0.0  # scale around the mean by U(1-c, 1+c)
    noise_stddev: Annotated[float, Field(ge=0)] = 0.0  # add N(0, s^2)
