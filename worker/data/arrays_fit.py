"""Whether an `arrays` spec fits its stored dataset: which dtype `x` takes, the vocabulary of
token ids, the classes of the labels, and whether the split can serve the spec's batches.

TensorFlow-free, from the arrays' shapes, dtypes and value ranges alone, so the API refuses a
misfit at submission from what the dataset's record holds, and the generator applies the
same rules in the job from the arrays themselves.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from worker.data.batch_source import DataInfo
from worker.data.dataset_format import ArrayInfo, DatasetInfo
from worker.models import builtin_params as bp

AUGMENTATIONS = ("flip_left_right", "crop_padding", "brightness", "contrast", "noise_stddev")


class FitError(ValueError):
    """The dataset cannot serve the spec; `loc` is the spec field to change."""

    def __init__(self, loc: str, msg: str) -> None:
        super().__init__(f"{loc}: {msg}")
        self.loc, self.msg = loc, msg


@dataclass(frozen=True)
class Split:
    """Rows held out for evaluation and rows left for training."""

    train: int
    eval: int


def keeps_integers(x_dtype: str, p: bp.ArraysParams, *, token_ids: bool) -> bool:
    """Whether `x` stays integer token ids rather than becoming float32: integer `x` when
    the architecture takes token ids or `x_dtype` is "int32"; FitError when they disagree."""
    integer = np.dtype(x_dtype).kind in "iu"
    if p.x_dtype == "int32":
        if not integer:
            msg = f"x_dtype int32 keeps integer token ids, but {p.x!r} holds {x_dtype}"
            raise FitError("dataset.params.x_dtype", msg)
    elif p.x_dtype == "float32" or not token_ids:
        return False
    elif not integer:
        msg = (
            f"the architecture takes integer token ids; {p.x!r} holds {x_dtype} "
            "(store the ids as an integer array)"
        )
        raise FitError("dataset.params.x", msg)
    changed = [a for a in AUGMENTATIONS if getattr(p, a)]
    if p.scale != 1.0 or p.offset != 0.0:
        changed[:0] = ["scale/offset"]
    if changed:
        msg = f"token ids are not scaled or augmented; remove {', '.join(changed)}"
        raise FitError("dataset.params", msg)
    return True


def token_vocab(low: int | None, high: int | None, p: bp.ArraysParams) -> int | None:
    """The vocabulary of token ids running from `low` to `high` (None: not known): vocab_size,
    or the largest id + 1; FitError for ids outside it."""
    if low is not None and low < 0:
        raise FitError("dataset.params.x", f"token ids run from {low}; they must be 0 or more")
    if p.vocab_size is not None:
        if high is not None and high >= p.vocab_size:
            msg = (
                f"token ids in {p.x!r} run up to {high}, outside the vocabulary "
                f"0..{p.vocab_size - 1} (vocab_size {p.vocab_size})"
            )
            raise FitError("dataset.params.vocab_size", msg)
        return p.vocab_size
    if high is None:
        return None
    if high >= bp.MAX_VOCAB_SIZE:
        msg = f"token ids in {p.x!r} run up to {high}; a vocabulary holds at most " + (
            f"{bp.MAX_VOCAB_SIZE} ids"
        )
        raise FitError("dataset.params.x", msg)
    return max(high + 1, 2)


def label_classes(
    y_dtype: str, y_shape: tuple[int, ...], low: int | None, high: int | None, p: bp.ArraysParams
) -> int | None:
    """Classes of integer labels (None: float regression targets, or not known yet);
    FitError for labels that are not one class id per sample or fall outside the classes."""
    if np.dtype(y_dtype).kind not in "biu":
        if p.num_classes is not None:
            raise FitError("dataset.params.num_classes", f"is set but the labels are {y_dtype}")
        return None
    if len(y_shape) != 1:
        msg = f"class labels must be one per sample, got {y_shape}"
        raise FitError("dataset.params.y", msg)
    if low is None or high is None:
        return p.num_classes
    classes = p.num_classes if p.num_classes is not None else max(high + 1, 2)
    if low < 0 or high >= classes:
        msg = f"labels run from {low} to {high}; classes must be 0..{classes - 1}"
        raise FitError("dataset.params.num_classes", msg)
    return classes


def split(samples: int, p: bp.ArraysParams) -> Split:
    """The held-out split of `samples` rows; FitError when it leaves a split empty."""
    n_eval = round(samples * p.eval_fraction)
    if samples - n_eval < 1 or (p.eval_fraction > 0 and n_eval < 1):
        msg = f"eval_fraction {p.eval_fraction} of {samples} samples leaves a split empty"
        raise FitError("dataset.params.eval_fraction", msg)
    return Split(samples - n_eval, n_eval)


def check_batches(rows: Split, *, batch_size: int, train_batches: int, eval_batches: int) -> None:
    """FitError when an epoch's batches need more training rows, or the evaluation batches
    more held-out rows, than the split has (each row is read at most once per epoch)."""
    if train_batches * batch_size > rows.train:
        msg = (
            f"an epoch of {train_batches} batches of {batch_size} needs "
            f"{train_batches * batch_size} training samples; the data has {rows.train} "
            "(each appears at most once per epoch)"
        )
        raise FitError("dataset.train_batches", msg)
    if eval_batches and eval_batches * batch_size > rows.eval:
        msg = (
            f"{eval_batches} evaluation batches of {batch_size} need "
            f"{eval_batches * batch_size} held-out samples; the data has {rows.eval}"
        )
        raise FitError("dataset.eval_batches", msg)


def describe(
    params: dict[str, Any], dataset: DatasetInfo, spec_dataset: Any, *, token_ids: bool
) -> DataInfo | None:
    """One sample as the architecture gets it, from the dataset's record; FitError for a
    dataset that cannot serve the spec. None when the record lacks the value ranges needed
    (classes or vocabulary): the job finds them from the arrays."""
    p = bp.ArraysParams.model_validate(params)
    x, y = (_array(dataset, name, role) for role, name in (("x", p.x), ("y", p.y)))
    if any(getattr(p, a) for a in AUGMENTATIONS) and len(x.shape) != 4:
        msg = f"augmentation needs images [N, H, W, C]; {p.x!r} has shape {x.shape}"
        raise FitError("dataset.params", msg)
    tokens = keeps_integers(x.dtype, p, token_ids=token_ids)
    vocab = token_vocab(x.low, x.high, p) if tokens else None
    classes = label_classes(y.dtype, y.shape, y.low, y.high, p)
    check_batches(
        split(dataset.samples, p),
        batch_size=spec_dataset.batch_size,
        train_batches=spec_dataset.train_batches,
        eval_batches=spec_dataset.eval_batches,
    )
    integer_y = np.dtype(y.dtype).kind in "biu"
    if (tokens and vocab is None) or (integer_y and classes is None):
        return None
    x_dtype = "int32" if tokens else "float32"
    y_dtype = "int32" if integer_y else "float32"
    return DataInfo(x.shape[1:], x_dtype, y.shape[1:], y_dtype, classes, vocab)


def _array(dataset: DatasetInfo, name: str, role: str) -> ArrayInfo:
    for info in dataset.arrays:
        if info.name == name:
            return info
    known = ", ".join(a.name for a in dataset.arrays)
    raise FitError(f"dataset.params.{role}", f"the dataset has no array {name!r} (it has: {known})")
