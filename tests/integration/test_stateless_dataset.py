"""StatelessRngDataset on real TensorFlow: a batch's values depend on its seed, nothing else."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import tensorflow as tf

from worker.data import generators
from worker.data.stateless_dataset import AUTOTUNE, StatelessRngDataset
from worker.errors import GeneratorError

BUILTINS = {
    "gaussian_blobs": {"num_features": 6, "num_classes": 3},
    "regression": {"num_features": 5, "targets": 2},
    "pattern_images": {"image_size": 8, "channels": 2},
    "token_sequences": {"vocab_size": 20, "seq_len": 12},
}


def _factory(name: str, **kwargs: Any) -> StatelessRngDataset:
    source = getattr(generators, name)(BUILTINS[name], batch_size=32)
    args: dict[str, Any] = {
        "batch_size": 32,
        "num_batches": 12,
        "base_seed": (11, 22),
        "name": name,
    }
    args.update(kwargs)
    return StatelessRngDataset(source.batch_generator, **args)


def _emitted(ds: StatelessRngDataset) -> list[list[np.ndarray]]:
    return [[np.asarray(t) for t in tf.nest.flatten(b)] for b in ds.as_dataset()]


def _same(a: list[np.ndarray], b: list[np.ndarray]) -> bool:
    return len(a) == len(b) and all(
        x.dtype == y.dtype and x.shape == y.shape and x.tobytes() == y.tobytes()
        for x, y in zip(a, b, strict=True)
    )


@pytest.mark.parametrize("name", sorted(BUILTINS))
def test_parallelism_and_prefetch_change_no_value(name: str) -> None:
    serial = _factory(name, num_parallel_calls=None, prefetch_buffer=0, deterministic_order=True)
    reference = _emitted(serial)
    assert len(reference) == 12
    expected = {i: batch for i, batch in enumerate(reference)}
    for calls, prefetch in [(AUTOTUNE, AUTOTUNE), (2, 1), (8, 0), (1, 16)]:
        ds = _factory(
            name, num_parallel_calls=calls, prefetch_buffer=prefetch, deterministic_order=True
        )
        emitted = _emitted(ds)
        assert all(_same(expected[i], b) for i, b in enumerate(emitted)), (calls, prefetch)
        assert ds.data_fingerprint() == serial.data_fingerprint()
    # Unordered emission: every emitted batch is still exactly one of the expected batches.
    unordered = _emitted(_factory(name, num_parallel_calls=4, deterministic_order=False))
    matched = sorted(next(i for i, e in expected.items() if _same(e, b)) for b in unordered)
    assert matched == list(range(12))


@pytest.mark.parametrize("name", sorted(BUILTINS))
def test_a_batch_computed_alone_equals_the_pipeline_element(name: str) -> None:
    ds = _factory(name, deterministic_order=True)
    emitted = _emitted(ds)
    for batch_id in (0, 5, 11):
        alone = [np.asarray(t) for t in tf.nest.flatten(ds.make_batch(batch_id))]
        assert _same(alone, emitted[batch_id])


def test_epoch_shard_and_seed_each_change_the_data() -> None:
    base = _factory("gaussian_blobs")
    fingerprints = {
        base.data_fingerprint(),
        base.for_epoch(1).data_fingerprint(),
        base.with_options(shard_key=1).data_fingerprint(),
        base.with_options(shard_key=2).data_fingerprint(),
        base.with_options(base_seed=(11, 23)).data_fingerprint(),
        base.with_options(stream=1).data_fingerprint(),
    }
    assert len(fingerprints) == 6
    # ...and the same coordinates always give the same data.
    assert (
        base.for_epoch(1).data_fingerprint()
        == _factory("gaussian_blobs", epoch=1).data_fingerprint()
    )


def test_batches_of_one_epoch_are_not_copies_of_each_other() -> None:
    batches = _emitted(_factory("gaussian_blobs", deterministic_order=True))
    assert len({b[0].tobytes() for b in batches}) == len(batches)


def test_null_seed_is_random_and_retrievable() -> None:
    a = _factory("regression", base_seed=None)
    b = _factory("regression", base_seed=None)
    assert a.resolved_seed_tuple() != b.resolved_seed_tuple()
    again = _factory("regression", base_seed=a.resolved_seed_tuple())
    assert again.data_fingerprint() == a.data_fingerprint()
    assert _factory("regression", base_seed=7).resolved_seed_tuple() == (7, 0)


def test_xla_compiled_generator_is_deterministic_and_preserves_the_api() -> None:
    a = _factory("gaussian_blobs", xla_compile_generator=True, deterministic_order=True)
    b = _factory("gaussian_blobs", xla_compile_generator=True, num_parallel_calls=1)
    assert a.data_fingerprint() == b.data_fingerprint()
    assert len(_emitted(a)) == 12


def test_cardinality_is_known_and_asserted() -> None:
    ds = _factory("token_sequences", assert_cardinality=True).as_dataset()
    assert int(ds.cardinality()) == 12
    assert sum(1 for _ in ds) == 12


def test_dict_outputs_are_supported() -> None:
    def gen(indices: tf.Tensor, seed: tf.Tensor) -> dict[str, tf.Tensor]:
        x = tf.random.stateless_uniform([tf.shape(indices)[0], 3], seed=seed)
        return {"x": x, "y": tf.cast(tf.reduce_sum(x, -1) > 1.5, tf.int32), "idx": indices}

    ds = StatelessRngDataset(
        gen, batch_size=4, num_batches=3, base_seed=1, deterministic_order=True
    )
    batches = list(ds.as_dataset().as_numpy_iterator())
    assert [b["idx"].tolist() for b in batches] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]]


def test_stateful_rng_is_named_and_refused_when_asked() -> None:
    def noisy(indices: tf.Tensor, seed: tf.Tensor) -> tf.Tensor:
        return tf.random.uniform([tf.shape(indices)[0], 2], seed=None)

    with pytest.raises(GeneratorError) as info:
        StatelessRngDataset(
            noisy, batch_size=4, num_batches=2, base_seed=1, forbid_stateful_rng=True
        )
    assert "'noisy'" in str(info.value) and "RandomUniform" in str(info.value)
    allowed = StatelessRngDataset(noisy, batch_size=4, num_batches=2, base_seed=1)
    assert allowed.stateful_random_ops == ["RandomUniform"]
    # A copy reuses the inspection, and still refuses when asked to.
    assert allowed.for_epoch(3).stateful_random_ops == ["RandomUniform"]
    with pytest.raises(GeneratorError, match="RandomUniform"):
        allowed.with_options(forbid_stateful_rng=True)


def test_wrong_structure_is_named() -> None:
    def scalar(indices: tf.Tensor, seed: tf.Tensor) -> tf.Tensor:
        return tf.reduce_sum(tf.random.stateless_normal([3], seed=seed))

    with pytest.raises(GeneratorError, match=r"'scalar'.*leading batch dimension"):
        StatelessRngDataset(scalar, batch_size=4, num_batches=2, base_seed=1)

    def untraceable(indices: tf.Tensor, seed: tf.Tensor) -> Any:
        return {"x": object()}

    with pytest.raises(GeneratorError, match="'untraceable'"):
        StatelessRngDataset(untraceable, batch_size=4, num_batches=2, base_seed=1)


def _epoch_shuffled(indices: tf.Tensor, seed: tf.Tensor, epoch_seed: tf.Tensor) -> Any:
    """A generator given its epoch's seed too, as the arrays generator's shuffle is."""
    order = tf.random.experimental.index_shuffle(indices, epoch_seed, 1_000)
    x = tf.random.stateless_normal([tf.shape(indices)[0], 3], seed=seed)
    return x + tf.cast(order, tf.float32)[:, None], order


@pytest.mark.parametrize("name", [*sorted(BUILTINS), "epoch_shuffled"])
def test_one_pipeline_of_several_epochs_gives_each_epochs_batches(name: str) -> None:
    """A run's single pipeline yields, in order, what a dataset per epoch would have."""
    options: dict[str, Any] = {"deterministic_order": True, "shard_key": 3, "stream": 2}
    if name == "epoch_shuffled":
        ds = StatelessRngDataset(
            _epoch_shuffled,
            batch_size=32,
            num_batches=12,
            base_seed=(11, 22),
            pass_epoch_seed=True,
            **options,
        )
    else:
        ds = _factory(name, **options)
    expected = [
        batch
        for epoch in (2, 3, 4)
        for batch in _emitted(ds.for_epoch(epoch))[5 if epoch == 2 else 0 :]
    ]
    # Resumed at batch 5 of epoch 2: 7 + 12 + 12 batches.
    whole = ds.with_options(assert_cardinality=True).epochs_dataset(2, 4, first_batch=5)
    assert int(whole.cardinality()) == 31
    emitted = [[np.asarray(t) for t in tf.nest.flatten(b)] for b in whole]
    assert len(emitted) == len(expected) == 31
    assert all(_same(a, b) for a, b in zip(emitted, expected, strict=True))
    # Epochs differ (the table of epoch seeds is indexed, not one seed reused).
    assert not _same(emitted[7], emitted[19])
    single = [[np.asarray(t) for t in tf.nest.flatten(b)] for b in ds.epochs_dataset(0, 0)]
    assert all(_same(a, b) for a, b in zip(single, _emitted(ds), strict=True))


def test_one_pipeline_refuses_positions_outside_its_epochs() -> None:
    ds = _factory("regression")
    for first, last, batch in ((3, 2, 0), (-1, 2, 0), (1, 2, 12), (1, 2, -1)):
        with pytest.raises(ValueError):
            ds.epochs_dataset(first, last, first_batch=batch)


def test_other_epochs_shards_and_options_reuse_the_traced_generator() -> None:
    """`for_epoch` and `with_options` trace the generator again only for options that
    change its compiled form (XLA, the epoch seed argument)."""
    traces = []

    def counted(indices: tf.Tensor, seed: tf.Tensor) -> tf.Tensor:
        traces.append(1)  # runs once per trace, never per batch
        return tf.random.stateless_normal([tf.shape(indices)[0], 2], seed=seed)

    ds = StatelessRngDataset(counted, batch_size=4, num_batches=3, base_seed=1)
    assert len(traces) == 1
    copies = [
        ds.for_epoch(5),
        ds.with_options(shard_key=1, stream=2),
        ds.with_options(num_parallel_calls=None, prefetch_buffer=0),
    ]
    for copy in copies:
        list(copy.as_dataset())
        copy.make_batch(1)
    assert len(traces) == 1
    assert len({c.data_fingerprint() for c in [ds, *copies[:2]]}) == 3
    assert copies[2].data_fingerprint() == ds.data_fingerprint()
    ds.with_options(xla_compile_generator=True)
    assert len(traces) == 2
