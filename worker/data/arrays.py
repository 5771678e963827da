"""The `arrays` generator: batches drawn from a stored dataset, shuffled and augmented
statelessly, so any batch of any epoch can be made again on its own.

Row ids go through two keyed bijections, each O(1) per id and without a buffer:
  - a split, fixed by `split_seed`: position q of a permutation of all N rows; the first
    `round(N * eval_fraction)` positions are the held-out rows, the rest the training rows;
  - per epoch, a permutation of the training positions keyed by the epoch's seed, so each
    epoch visits every training row at most once, in its own order.
Both are `tf.random.experimental.index_shuffle`. Augmentation is keyed by the batch seed and
drawn per sample. Evaluation batches read the held-out rows in a fixed order, unaugmented.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import tensorflow as tf

from worker.data import arrays_fit
from worker.data.batch_source import BatchSource
from worker.errors import GeneratorError
from worker.models import builtin_params as bp

_NAME = "arrays"
_SPLIT_SALT = 0x5EED5  # second word of the split's key: apart from any run seed
_AUGMENTATIONS = arrays_fit.AUGMENTATIONS


def _split_rows(n: int, n_eval: int, split_seed: int) -> tuple[tf.Tensor, tf.Tensor]:
    """(training rows, held-out rows) as int64 tensors; fixed by `split_seed`."""
    positions = tf.range(n, dtype=tf.int64)
    if n_eval == 0:
        return positions, positions[:0]
    key = tf.constant([split_seed, _SPLIT_SALT], tf.int64)
    rows = tf.random.experimental.index_shuffle(positions, key, tf.constant(n - 1, tf.int64))
    return rows[n_eval:], rows[:n_eval]


def _labels(y: np.ndarray, num_classes: int | None) -> tuple[tf.Tensor, int | None]:
    if y.dtype.kind in "biu":
        labels = np.asarray(y, dtype=np.int64)
        if labels.ndim != 1:
            raise GeneratorError(_NAME, f"class labels must be one per sample, got {y.shape}")
        low, high = int(labels.min()), int(labels.max())
        classes = num_classes if num_classes is not None else max(high + 1, 2)
        if low < 0 or high >= classes:
            raise GeneratorError(
                _NAME, f"labels run from {low} to {high}; classes must be 0..{classes - 1}"
            )
        return tf.constant(labels.astype(np.int32)), classes
    if num_classes is not None:
        raise GeneratorError(_NAME, f"num_classes is set but the labels are {y.dtype}")
    return tf.constant(np.asarray(y, dtype=np.float32)), None


def _normalise(x: tf.Tensor, p: bp.ArraysParams) -> tf.Tensor:
    return tf.cast(x, tf.float32) * p.scale + p.offset


def _augment(x: tf.Tensor, seed: tf.Tensor, p: bp.ArraysParams) -> tf.Tensor:
    """Per-sample augmentation of stored images [B, H, W, C], normalised; a pure function of
    (x, seed).

    Flips and crops move stored values (e.g. 1-byte pixels, padding with stored zeros) before
    the conversion to float32; brightness and contrast fold into one per-sample affine map
    of the normalised image: fewer passes over the batch than one op per augmentation.
    Each augmentation has its own key split from the batch seed, so turning one on or off
    leaves the others' draws as they were.
    """
    s_flip, s_crop, s_bright, s_contrast, s_noise = tf.unstack(
        tf.random.experimental.stateless_split(seed, 5)
    )
    n = tf.shape(x)[0]
    # Crop and flip are index maps: image j-th column = padded column `offset + j`, or
    # `offset + W - 1 - j` when flipped (a crop, then a flip). Gathering rows and then columns
    # per sample does both in two passes; tf.image.stateless_random_crop would take one
    # offset for the whole batch, and its flip another pass.
    pad, height, width = p.crop_padding, x.shape[1], x.shape[2]
    cols = tf.tile(tf.range(width)[tf.newaxis, :], [n, 1])
    if p.flip_left_right:
        flip = tf.random.stateless_uniform([n, 1], seed=s_flip) < 0.5
        cols = tf.where(flip, width - 1 - cols, cols)
    if pad:
        x = tf.pad(x, [[0, 0], [pad, pad], [pad, pad], [0, 0]])
        offsets = tf.random.stateless_uniform(
            [n, 2], seed=s_crop, minval=0, maxval=2 * pad + 1, dtype=tf.int32
        )
        x = tf.gather(x, offsets[:, :1] + tf.range(height)[tf.newaxis, :], axis=1, batch_dims=1)
        cols += offsets[:, 1:]
    if pad or p.flip_left_right:
        x = tf.gather(x, cols, axis=2, batch_dims=1)
    x = _normalise(x, p)
    if p.brightness or p.contrast:
        # contrast: (x - mean) * f + mean, per image and channel; brightness: + d.
        # Together: x * f + (mean * (1 - f) + d).
        factor = tf.ones([n, 1, 1, 1])
        shift = tf.zeros([n, 1, 1, 1])
        if p.contrast:
            factor = tf.random.stateless_uniform(
                [n, 1, 1, 1], seed=s_contrast, minval=1 - p.contrast, maxval=1 + p.contrast
            )
            shift = tf.reduce_mean(x, axis=[1, 2], keepdims=True) * (1 - factor)
        if p.brightness:
            shift += tf.random.stateless_uniform(
                [n, 1, 1, 1], seed=s_bright, minval=-p.brightness, maxval=p.brightness
            )
        x = x * factor + shift
    if p.noise_stddev:
        x += tf.random.stateless_normal(tf.shape(x), seed=s_noise, stddev=p.noise_stddev)
    return x


def _token_ids(x: np.ndarray, p: bp.ArraysParams, token_ids: bool) -> tuple[bool, int | None]:
    """(whether x stays integer token ids, their vocabulary), by the rules the API checks."""
    try:
        if not arrays_fit.keeps_integers(x.dtype.name, p, token_ids=token_ids):
            return False, None
        low, high = (int(x.min()), int(x.max())) if x.size else (None, None)
        return True, arrays_fit.token_vocab(low, high, p) or 2
    except arrays_fit.FitError as exc:
        raise GeneratorError(_NAME, str(exc)) from None


def arrays(
    params: dict[str, Any],
    *,
    batch_size: int,
    data: dict[str, np.ndarray] | None = None,
    token_ids: bool = False,
) -> BatchSource:
    """Batches of rows of the dataset's `x` and `y` arrays (see the module docstring);
    integer `x` stays int32 token ids when `token_ids` (the architecture takes them) or
    params.x_dtype says so, and becomes float32 otherwise."""
    p = bp.ArraysParams.model_validate(params)
    if data is None:
        raise GeneratorError(
            _NAME,
            "needs a stored dataset: set dataset.data to its digest and give the job the file",
        )
    for role, name in (("x", p.x), ("y", p.y)):
        if name not in data:
            raise GeneratorError(
                _NAME,
                f"params.{role}: the dataset has no array {name!r} (it has: {', '.join(data)})",
            )
    x_np, y_np = data[p.x], data[p.y]
    augmenting = any(getattr(p, a) for a in _AUGMENTATIONS)
    tokens, vocab_size = _token_ids(np.asarray(x_np), p, token_ids)
    if augmenting and x_np.ndim != 4:
        raise GeneratorError(
            _NAME, f"augmentation needs images [N, H, W, C]; {p.x!r} has shape {x_np.shape}"
        )
    n = int(x_np.shape[0])
    n_eval = round(n * p.eval_fraction)
    n_train = n - n_eval
    if n_train < 1 or (p.eval_fraction > 0 and n_eval < 1):
        raise GeneratorError(
            _NAME, f"eval_fraction {p.eval_fraction} of {n} samples leaves a split empty"
        )
    # One copy in this process's memory, captured by the generator functions as an input
    # (not embedded in their graphs).
    x_all = tf.constant(np.asarray(x_np, dtype=np.int32) if tokens else np.asarray(x_np))

    # Token ids are looked up as they are; anything else becomes float32 as it always has.
    def convert(x: tf.Tensor) -> tf.Tensor:
        return x if tokens else _normalise(x, p)

    y_all, num_classes = _labels(np.asarray(y_np), p.num_classes)
    train_rows, eval_rows = _split_rows(n, n_eval, p.split_seed)
    last_train = tf.constant(n_train - 1, tf.int64)

    def arrays_batch(
        indices: tf.Tensor, seed: tf.Tensor, epoch_seed: tf.Tensor
    ) -> tuple[tf.Tensor, tf.Tensor]:
        positions = indices
        if p.shuffle:
            positions = tf.random.experimental.index_shuffle(indices, epoch_seed, last_train)
        rows = tf.gather(train_rows, positions)
        x = tf.gather(x_all, rows)
        x = _augment(x, seed, p) if augmenting else convert(x)
        return x, tf.gather(y_all, rows)

    def arrays_eval_batch(indices: tf.Tensor, seed: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        rows = tf.gather(eval_rows, indices)
        return convert(tf.gather(x_all, rows)), tf.gather(y_all, rows)

    return BatchSource(
        arrays_batch,
        num_classes=num_classes,
        vocab_size=vocab_size,
        takes_epoch_seed=True,
        eval_batch_generator=arrays_eval_batch if n_eval else None,
        train_samples=n_train,
        eval_samples=n_eval if n_eval else None,
    )
