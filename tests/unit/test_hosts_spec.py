"""`distribution.hosts` in the spec, and a host's place in its cluster from `TF_CONFIG`."""

from __future__ import annotations

import json
from typing import Any

import pytest

from worker.errors import SpecError
from worker.spec import parse_spec
from worker.training.cluster import ClusterError, Host, own_shards, this_host
from worker.training.replicas import DeviceError, Placement, _host_cpu_devices, place_replicas


def _spec(**changes: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "name": "hosts",
        "seed": 3,
        "dataset": {"generator": "gaussian_blobs", "batch_size": 32, "train_batches": 2},
        "model": {"architecture": "mlp"},
        "training": {"epochs": 1, "loss": {"name": "mean_squared_error"}},
    }
    for section, fields in changes.items():
        spec[section] = {**spec.get(section, {}), **fields}
    return spec


def test_one_host_is_the_spec_as_it_always_was() -> None:
    before = parse_spec(_spec()).spec_hash()
    assert parse_spec(_spec(distribution={"hosts": 1})).spec_hash() == before
    assert parse_spec(_spec(distribution={"hosts": 1, "replicas": 1})).spec_hash() == before
    sharded = _spec(dataset={"shards": 4})
    assert parse_spec({**sharded, "distribution": {"hosts": 2}}).spec_hash() != (
        parse_spec(sharded).spec_hash()
    )


@pytest.mark.parametrize(
    ("changes", "said"),
    [
        ({"distribution": {"hosts": 2}}, "distribution.hosts 2 must divide dataset.shards 1"),
        (
            {"distribution": {"hosts": 3}, "dataset": {"shards": 4}},
            "set dataset.shards to a multiple of 3",
        ),
        (
            {
                "distribution": {"hosts": 4, "replicas": 2},
                "dataset": {"shards": 4, "batch_size": 4},
            },
            "cannot be split over 8 replicas (4 host(s) x 2)",
        ),
        ({"distribution": {"hosts": 0}}, "greater than or equal to 1"),
        ({"distribution": {"hosts": 65}}, "less than or equal to 64"),
    ],
)
def test_hosts_that_cannot_split_the_batch_are_refused(changes: dict[str, Any], said: str) -> None:
    with pytest.raises(SpecError) as caught:
        parse_spec(_spec(**changes))
    assert said in str(caught.value)


def _config(workers: list[str], index: int, kind: str = "worker") -> dict[str, str]:
    return {
        "TF_CONFIG": json.dumps(
            {"cluster": {"worker": workers}, "task": {"type": kind, "index": index}}
        )
    }


def test_a_host_reads_its_rank_and_its_shards() -> None:
    workers = ["10.0.0.1:7000", "10.0.0.2:7000", "10.0.0.3:7000"]
    host = this_host(3, _config(workers, 2))
    assert host == Host(3, 2, tuple(workers))
    assert own_shards(6, host) == (4, 6)
    assert own_shards(6, this_host(3, _config(workers, 0))) == (0, 2)
    # One host ignores any cluster description and generates every shard.
    assert this_host(1, _config(workers, 1)) == Host(1, 0)
    assert own_shards(6, Host(1, 0)) is None


@pytest.mark.parametrize(
    ("environ", "said"),
    [
        ({}, "TF_CONFIG is not set"),
        ({"TF_CONFIG": "{not json"}, "TF_CONFIG must be"),
        ({"TF_CONFIG": json.dumps({"cluster": {}})}, "TF_CONFIG must be"),
        (_config(["a:1", "b:1", "c:1"], 0), "describes 3 worker(s)"),
        (_config(["a:1", "b:1"], 2), "an index below 2"),
        (_config(["a:1", "b:1"], 0, kind="chief"), "task must be a worker"),
        (_config(["a:1", ""], 0), "list of host:port addresses"),
        (
            {
                "TF_CONFIG": json.dumps(
                    {
                        "cluster": {"worker": ["a:1", "b:1"], "ps": ["c:1"]},
                        "task": {"type": "worker", "index": 0},
                    }
                )
            },
            "may name only workers, not ps",
        ),
    ],
)
def test_a_cluster_that_does_not_fit_the_run_is_refused(environ: dict[str, str], said: str) -> None:
    with pytest.raises(ClusterError) as caught:
        this_host(2, environ)
    assert said in str(caught.value)


def test_a_cpu_host_trains_its_replicas_on_logical_devices_where_allowed() -> None:
    import tensorflow as tf

    if tf.config.list_physical_devices("GPU"):
        pytest.skip("the path of a host without GPUs; this one has some")
    with pytest.raises(DeviceError, match="logical CPU devices are not allowed here"):
        place_replicas(2, hosts=2, rank=0, allow_logical_cpu=False)
    placement = place_replicas(1, hosts=2, rank=1)
    assert (placement.total_replicas, placement.first_replica) == (2, 1)
    assert placement.host_rows(32) == (16, 32)


def test_a_host_owns_its_replicas_rows_of_the_global_batch() -> None:
    # Three hosts of two replicas over a batch of 12: host 1 holds rows 4..8, replicas 2, 3.
    placement = Placement(2, [], "gpu", hosts=3, rank=1)
    assert (placement.total_replicas, placement.first_replica) == (6, 2)
    assert placement.host_rows(12) == (4, 8)


def test_a_cpu_host_gets_its_logical_devices_only_while_the_strategy_is_built() -> None:
    import tensorflow as tf
    from tensorflow.python.distribute import collective_all_reduce_strategy as collective

    if tf.config.list_physical_devices("GPU"):
        pytest.skip("the path of a host without GPUs; this one has some")
    extended = collective.CollectiveAllReduceExtended
    original = extended._initialize_local_devices
    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    # TensorFlow's own choice on a CPU host: one device, whatever logical ones exist.
    assert original(None, resolver, "/job:worker/task:1") == (
        ("/job:worker/task:1/device:CPU:0",),
        "CPU",
    )
    with _host_cpu_devices(3):
        devices, kind = extended._initialize_local_devices(None, resolver, "/job:worker/task:1")
    assert kind == "CPU"
    assert devices == tuple(f"/job:worker/task:1/device:CPU:{i}" for i in range(3))
    assert extended._initialize_local_devices is original
