"""`dataset.shards`: a batch as equal shards of rows, each from its own seed, so that any
range of shards generated on its own equals those rows of the whole batch."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tensorflow as tf

from tests.integration.jobs import blobs_spec, run_job
from tests.integration.test_arrays_generator import _ids_dataset
from tests.integration.test_arrays_generator import _spec as arrays_spec
from tests.integration.test_stateless_dataset import BUILTINS
from worker.data.job_data import build_job_data
from worker.data.stateless_dataset import StatelessRngDataset
from worker.errors import SpecError
from worker.spec import ExperimentSpec, parse_spec

pytestmark = pytest.mark.slow


def _spec(generator: str, **dataset: Any) -> ExperimentSpec:
    return ExperimentSpec.model_validate(
        {
            "name": "row-split",
            "seed": 7,
            "dataset": {
                "generator": generator,
                "params": BUILTINS[generator],
                "batch_size": 24,
                "train_batches": 3,
                "eval_batches": 1,
                **dataset,
            },
            "model": {"architecture": "mlp"},
            "training": {"epochs": 1, "loss": {"name": "mean_squared_error"}},
        }
    )


def _leaves(batch: Any) -> list[np.ndarray]:
    return [np.asarray(t) for t in tf.nest.flatten(batch)]


def _joined(parts: list[Any]) -> list[np.ndarray]:
    return [np.concatenate(leaves) for leaves in zip(*map(_leaves, parts), strict=True)]


def _bitwise(a: list[np.ndarray], b: list[np.ndarray]) -> bool:
    return len(a) == len(b) and all(
        x.dtype == y.dtype and x.shape == y.shape and x.tobytes() == y.tobytes()
        for x, y in zip(a, b, strict=True)
    )


def _epoch(ds: StatelessRngDataset, epoch: int) -> list[list[np.ndarray]]:
    return [_leaves(b) for b in ds.for_epoch(epoch).as_dataset()]


def _split_equals_whole(whole: StatelessRngDataset, hosts: int) -> None:
    """Each of `hosts` generating its own shards of every batch: together, bit for bit,
    the batches generated whole (both epochs, through the pipeline)."""
    per_host = whole.row_shards // hosts
    parts = [
        whole.with_options(own_shards=(h * per_host, (h + 1) * per_host)) for h in range(hosts)
    ]
    assert {p.rows for p in parts} == {whole.batch_size // hosts}
    for epoch in (1, 2):
        by_host = [_epoch(p, epoch) for p in parts]
        for b, batch in enumerate(_epoch(whole, epoch)):
            assert _bitwise(batch, _joined([host[b] for host in by_host])), (epoch, b)


@pytest.mark.parametrize("generator", sorted(BUILTINS))
def test_every_builtin_generator_gives_the_same_rows_however_a_batch_is_split(
    generator: str,
) -> None:
    data = build_job_data(_spec(generator, shards=4), (7, 0))
    assert data.train.row_shards == 4
    for hosts in (2, 4):
        _split_equals_whole(data.train, hosts)
    assert data.eval is not None and data.eval.row_shards == 4
    _split_equals_whole(data.eval, 2)
    # Other shards, other data: each shard draws from its own seed.
    one = build_job_data(_spec(generator), (7, 0)).train
    assert not _bitwise(_leaves(one.for_epoch(1).make_batch(0)), _epoch(data.train, 1)[0])


def test_a_stored_dataset_split_into_shards_keeps_its_rows_and_order(tmp_path: Path) -> None:
    data = _ids_dataset(tmp_path)
    noisy = {"noise_stddev": 0.5}
    _split_equals_whole(
        build_job_data(arrays_spec(noisy, shards=5, eval_batches=0), (11, 0), data=data).train, 5
    )
    # Which rows a batch holds, and their order, come from the epoch's shuffle alone: without
    # augmentation the shards change nothing; with it, only the draws per row.
    plain = build_job_data(arrays_spec({}, eval_batches=0), (11, 0), data=data).train
    sharded = build_job_data(arrays_spec({}, shards=5, eval_batches=0), (11, 0), data=data).train
    for a, b in zip(_epoch(sharded, 1), _epoch(plain, 1), strict=True):
        assert _bitwise(a, b)


def test_a_generator_that_ignores_its_indices_count_cannot_be_sharded() -> None:
    def fixed(indices: tf.Tensor, seed: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        x = tf.random.stateless_normal([8, 3], seed=seed)  # always 8 rows
        return x, tf.zeros([8], tf.int32)

    ok = StatelessRngDataset(fixed, batch_size=8, num_batches=2, base_seed=1)
    assert ok.make_batch(0)[0].shape == (8, 3)
    sharded = ok.with_options(row_shards=2)
    with pytest.raises(tf.errors.InvalidArgumentError, match="one row per index"):
        sharded.make_batch(0)


def test_shards_must_split_the_batch_evenly_and_leave_old_hashes_alone() -> None:
    with pytest.raises(SpecError, match="batch_size 24 cannot be split into 5 equal shards"):
        parse_spec(_spec("gaussian_blobs").model_dump() | {"dataset": _dataset(shards=5)})
    assert _spec("gaussian_blobs", shards=1).spec_hash() == _spec("gaussian_blobs").spec_hash()
    assert "shards" not in _spec("gaussian_blobs").canonical_json()
    assert _spec("gaussian_blobs", shards=4).spec_hash() != _spec("gaussian_blobs").spec_hash()


def _dataset(**changes: Any) -> dict[str, Any]:
    return {**_spec("gaussian_blobs").dataset.model_dump(), **changes}


def test_a_job_trains_on_sharded_batches_and_reruns_identically(tmp_path: Path) -> None:
    dataset = {**blobs_spec()["dataset"], "shards": 4}
    spec = blobs_spec(dataset=dataset, distribution={"replicas": 2})
    a = run_job(spec, tmp_path / "a")
    b = run_job(spec, tmp_path / "b")
    assert a.returncode == b.returncode == 0, a.result.error
    assert a.result.final_fingerprint == b.result.final_fingerprint
    assert a.result.data_fingerprints == b.result.data_fingerprints
    plain = run_job(blobs_spec(distribution={"replicas": 2}), tmp_path / "plain")
    assert plain.result.data_fingerprints[0] != a.result.data_fingerprints[0]
