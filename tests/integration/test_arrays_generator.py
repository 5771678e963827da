"""The `arrays` generator over a stored dataset: stateless per-epoch shuffling, a fixed
held-out split, and augmentation keyed by the batch seed (real TensorFlow on the CPU)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tensorflow as tf

from worker.data.dataset_format import file_digest, open_arrays
from worker.data.job_data import build_job_data
from worker.data.stateless_dataset import StatelessRngDataset
from worker.errors import GeneratorError, SpecError
from worker.models.registry import check_spec
from worker.spec import ExperimentSpec

SAMPLES = 100
DIGEST = "sha256:" + "0" * 64  # build_job_data trusts its caller to have checked the file


def _ids_dataset(tmp_path: Path) -> dict[str, np.ndarray]:
    """Images whose every pixel is the sample's row id, so a batch tells which rows it holds."""
    x = np.broadcast_to(np.arange(SAMPLES, dtype=np.float32)[:, None, None, None], (100, 4, 4, 1))
    path = tmp_path / "ids.npz"
    np.savez(path, x=np.ascontiguousarray(x), y=np.arange(SAMPLES, dtype=np.int64) % 10)
    return open_arrays(path)


def _spec(params: dict[str, Any], **dataset: Any) -> ExperimentSpec:
    return ExperimentSpec.model_validate(
        {
            "name": "arrays",
            "seed": 11,
            "dataset": {
                "generator": "arrays",
                "data": DIGEST,
                "params": params,
                "batch_size": 10,
                "train_batches": 8,
                "eval_batches": 2,
                **dataset,
            },
            "model": {"architecture": "mlp"},
            "training": {"epochs": 2, "loss": {"name": "sparse_categorical_crossentropy"}},
        }
    )


def _rows(batch: Any) -> list[int]:
    return [int(v) for v in np.asarray(batch[0])[:, 0, 0, 0]]


def _epoch_rows(train: StatelessRngDataset, epoch: int) -> list[list[int]]:
    return [_rows(b) for b in train.for_epoch(epoch).as_dataset().as_numpy_iterator()]


def test_every_training_row_once_per_epoch_each_epoch_its_own_order(tmp_path: Path) -> None:
    data = build_job_data(_spec({"eval_fraction": 0.2}), (11, 0), data=_ids_dataset(tmp_path))
    assert data.warnings == [] and data.train.stateful_random_ops == []
    assert data.eval is not None
    held_out = sorted(r for b in data.eval.as_dataset().as_numpy_iterator() for r in _rows(b))
    assert len(held_out) == 20 == len(set(held_out))
    first, second = _epoch_rows(data.train, 1), _epoch_rows(data.train, 2)
    for epoch in (first, second):
        seen = sorted(r for batch in epoch for r in batch)
        # 80 training rows, 8 batches of 10: each appears exactly once, never a held-out one.
        assert seen == sorted(set(range(SAMPLES)) - set(held_out))
    assert first != second
    # The split is part of the task: another run seed holds out the same rows.
    other = build_job_data(_spec({"eval_fraction": 0.2}), (12, 0), data=_ids_dataset(tmp_path))
    assert other.eval is not None
    assert held_out == sorted(
        r for b in other.eval.as_dataset().as_numpy_iterator() for r in _rows(b)
    )
    assert _epoch_rows(other.train, 1) != first


def test_a_batch_regenerated_alone_equals_the_pipelines(tmp_path: Path) -> None:
    params = {"eval_fraction": 0.2, "crop_padding": 1, "brightness": 0.2, "noise_stddev": 0.1}
    data = build_job_data(_spec(params), (11, 0), data=_ids_dataset(tmp_path))
    epoch3 = data.train.for_epoch(3)
    consumed = list(epoch3.as_dataset().as_numpy_iterator())  # parallel map, as in training
    for b in (0, 5, 7):
        x, y = epoch3.make_batch(b)
        np.testing.assert_array_equal(x.numpy(), consumed[b][0])
        np.testing.assert_array_equal(y.numpy(), consumed[b][1])
    again = build_job_data(_spec(params), (11, 0), data=_ids_dataset(tmp_path))
    x, _ = again.train.for_epoch(3).make_batch(5)
    np.testing.assert_array_equal(x.numpy(), consumed[5][0])


def test_augmentation_is_per_sample_and_keyed_by_the_batch_seed(tmp_path: Path) -> None:
    plain = build_job_data(_spec({}, eval_batches=0), (11, 0), data=_ids_dataset(tmp_path)).train
    noisy = build_job_data(
        _spec({"noise_stddev": 0.5, "brightness": 0.5, "contrast": 0.5}, eval_batches=0),
        (11, 0),
        data=_ids_dataset(tmp_path),
    ).train
    x_plain, y_plain = plain.for_epoch(1).make_batch(0)
    x_noisy, y_noisy = noisy.for_epoch(1).make_batch(0)
    # The same rows in the same order (shuffling does not depend on augmentation)...
    np.testing.assert_array_equal(y_plain.numpy(), y_noisy.numpy())
    delta = (x_noisy - x_plain).numpy()
    # ...each sample changed by its own draw, and the next batch by other draws.
    assert len({round(float(d), 6) for d in delta[:, 0, 0, 0]}) == 10
    x_next, _ = noisy.for_epoch(1).make_batch(1)
    x_next_plain, _ = plain.for_epoch(1).make_batch(1)
    assert not np.allclose((x_next - x_next_plain).numpy(), delta)


def test_a_random_crop_moves_each_image_within_its_padding(tmp_path: Path) -> None:
    image = np.zeros((SAMPLES, 5, 5, 1), dtype=np.float32)
    image[:, 2, 2, 0] = 1.0  # one bright pixel in the centre
    path = tmp_path / "dots.npz"
    np.savez(path, x=image, y=np.zeros(SAMPLES, dtype=np.int64))
    data = build_job_data(
        _spec({"crop_padding": 2, "num_classes": 2}, eval_batches=0), (1, 0), data=open_arrays(path)
    )
    x, _ = data.train.for_epoch(1).make_batch(0)
    where = {tuple(int(v) for v in np.argwhere(img[:, :, 0] == 1.0)[0]) for img in x.numpy()}
    assert all(0 <= r <= 4 and 0 <= c <= 4 for r, c in where)
    assert len(where) > 1  # different images, different offsets
    assert float(tf.reduce_sum(x)) == 10.0  # a 2-pixel padding never crops the centre away


def test_a_flip_mirrors_some_images_and_leaves_the_others(tmp_path: Path) -> None:
    image = np.arange(25, dtype=np.float32).reshape(5, 5, 1)
    path = tmp_path / "ramp.npz"
    np.savez(path, x=np.repeat(image[np.newaxis], SAMPLES, 0), y=np.zeros(SAMPLES, dtype=np.int64))
    spec = _spec({"flip_left_right": True, "num_classes": 2}, eval_batches=0)
    x, _ = build_job_data(spec, (1, 0), data=open_arrays(path)).train.for_epoch(1).make_batch(0)
    flipped = [bool(np.array_equal(img, image[:, ::-1])) for img in x.numpy()]
    assert all(f or np.array_equal(img, image) for f, img in zip(flipped, x.numpy(), strict=True))
    assert 0 < sum(flipped) < 10


def test_index_shuffle_is_a_stateless_bijection() -> None:
    ids = tf.range(1000, dtype=tf.int64)
    seed = tf.constant([3, 4], tf.int64)
    one = tf.random.experimental.index_shuffle(ids, seed, tf.constant(999, tf.int64))
    two = tf.function(tf.random.experimental.index_shuffle)(ids, seed, tf.constant(999, tf.int64))
    np.testing.assert_array_equal(one.numpy(), two.numpy())
    assert sorted(one.numpy().tolist()) == list(range(1000))


@pytest.mark.parametrize(
    ("params", "dataset", "reason"),
    [
        ({"x": "images"}, {}, r"no array 'images' \(it has: x, y\)"),
        ({}, {}, "held-out samples"),  # eval batches without an eval split
        ({"eval_fraction": 0.5}, {"train_batches": 6}, "needs 60 training samples"),
        ({"eval_fraction": 0.1}, {}, "2 evaluation batches of 10 need 20"),
        ({"num_classes": 5}, {}, "labels run from 0 to 9"),
    ],
)
def test_a_dataset_that_cannot_serve_the_spec_is_refused(
    tmp_path: Path, params: dict[str, Any], dataset: dict[str, Any], reason: str
) -> None:
    with pytest.raises(GeneratorError, match=reason):
        build_job_data(_spec(params, **dataset), (11, 0), data=_ids_dataset(tmp_path))


def test_the_arrays_generator_needs_a_dataset_and_no_xla(tmp_path: Path) -> None:
    with pytest.raises(GeneratorError, match="needs a stored dataset"):
        build_job_data(_spec({"eval_fraction": 0.2}), (11, 0), data=None)
    spec = _spec({}).model_dump()
    with pytest.raises(SpecError, match=r"dataset\.data"):
        check_spec(
            ExperimentSpec.model_validate({**spec, "dataset": {**spec["dataset"], "data": None}})
        )
    with pytest.raises(SpecError, match=r"dataset\.xla"):
        check_spec(
            ExperimentSpec.model_validate({**spec, "dataset": {**spec["dataset"], "xla": True}})
        )
    path = tmp_path / "d.npz"
    np.savez(path, x=np.zeros((4, 2), dtype=np.float32), y=np.zeros(4, dtype=np.int64))
    assert file_digest(path).startswith("sha256:")
