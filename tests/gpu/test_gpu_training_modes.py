"""Bitwise reruns on GPUs beyond one fresh run: a run resumed from its checkpoint, two
replicas on two GPUs, steps compiled by XLA, mixed precision, and convolutions large enough
for cuDNN to autotune. Each run is checked to have trained on the GPUs it was given."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.gpu.gpu_jobs import (
    ONE_GPU,
    assert_same_training,
    checked_result,
    final_fingerprint,
    run_on,
)
from tests.gpu.gpu_specs import (
    MIXED_FLOAT16,
    RESUME_STOP_AFTER_EPOCH,
    attention_spec,
    autotuned_cnn_spec,
    conv_spec,
    hosts_spec,
    mixed_precision_definition,
    mixed_precision_spec,
    replicas_spec,
    resume_spec,
    xla_clusters,
    xla_environment,
)
from tests.integration.gang import Gang

pytestmark = pytest.mark.gpu

XLA_SPECS = {
    "small_cnn": conv_spec("gpu-xla-cnn", filters=[8, 16]),
    "tiny_transformer": attention_spec("gpu-xla-attention"),
}


def test_a_run_resumed_after_an_epoch_ends_identical_to_the_uninterrupted_run(
    gpu: dict[str, Any], tmp_path: Path
) -> None:
    spec = resume_spec()
    full = run_on(spec, tmp_path / "full", devices=ONE_GPU, gpus=1)
    checkpoints = str(tmp_path / "checkpoints")
    half = run_on(
        spec,
        tmp_path / "half",
        "--checkpoint-dir",
        checkpoints,
        "--stop-after-epoch",
        str(RESUME_STOP_AFTER_EPOCH),
        devices=ONE_GPU,
        gpus=1,
        status="interrupted",
    )
    assert half.interrupted_after_epoch == RESUME_STOP_AFTER_EPOCH
    assert half.final_fingerprint is None
    resumed = run_on(
        spec,
        tmp_path / "resumed",
        "--checkpoint-dir",
        checkpoints,
        "--resume",
        devices=ONE_GPU,
        gpus=1,
    )
    assert resumed.resumed_from_epoch == RESUME_STOP_AFTER_EPOCH
    assert_same_training(resumed, full)


def test_two_replicas_on_two_gpus_rerun_bitwise_identical(two_gpus: str, tmp_path: Path) -> None:
    spec = replicas_spec(2)
    a = run_on(spec, tmp_path / "a", devices=two_gpus, gpus=2)
    b = run_on(spec, tmp_path / "b", devices=two_gpus, gpus=2)
    for result in (a, b):
        placed = result.determinism["distribution"]
        assert placed["device_kind"] == "gpu"
        assert placed["replicas"] == 2 and len(placed["devices"]) == 2
        assert placed["cross_device_ops"] == "ReductionToOneDevice"
        assert {g["uuid"] for g in result.provenance["gpus"]} == set(two_gpus.split(","))
    assert_same_training(a, b)


def test_two_hosts_of_one_gpu_each_rerun_bitwise_identical(two_gpus: str, tmp_path: Path) -> None:
    # Two processes, each seeing one of the two GPUs, joined by the ring all-reduce.
    envs = [{"CUDA_VISIBLE_DEVICES": uuid} for uuid in two_gpus.split(",")]
    runs = []
    for name in ("a", "b"):
        members = Gang(hosts_spec(2, 1), tmp_path / name, envs=envs).wait()
        results = [checked_result(m, gpus=1) for m in members]
        placed = results[0].determinism["distribution"]
        assert placed["strategy"] == "MultiWorkerMirroredStrategy"
        assert placed["cross_device_ops"] == "CollectiveAllReduce (RING)"
        assert placed["device_kind"] == "gpu"
        runs.append(results[0])
    assert_same_training(runs[0], runs[1])
    # One process of the same two GPUs trains on the same rows of every batch.
    one_host = run_on(hosts_spec(1, 2), tmp_path / "one", devices=two_gpus, gpus=2)
    assert one_host.data_fingerprints == runs[0].data_fingerprints


@pytest.mark.parametrize("architecture", sorted(XLA_SPECS))
def test_steps_compiled_by_xla_rerun_bitwise_identical(
    gpu: dict[str, Any], architecture: str, tmp_path: Path
) -> None:
    spec = XLA_SPECS[architecture]
    results = []
    for name in ("a", "b"):
        dump = tmp_path / f"{name}-xla"
        result = run_on(spec, tmp_path / name, devices=ONE_GPU, gpus=1, env=xla_environment(dump))
        assert result.determinism["op_determinism"] is True
        assert result.provenance["environment"]["TF_XLA_FLAGS"] == "--tf_xla_auto_jit=2"
        assert xla_clusters(dump), f"XLA compiled no cluster of the steps ({dump} is empty)"
        results.append(result)
    assert_same_training(results[0], results[1])


def test_mixed_precision_reruns_bitwise_identical_and_differ_from_float32(
    gpu: dict[str, Any], tmp_path: Path
) -> None:
    mixed = mixed_precision_definition(MIXED_FLOAT16)
    model = tmp_path / "mixed.json"
    model.write_bytes(mixed)
    spec = mixed_precision_spec(mixed)
    a = run_on(spec, tmp_path / "a", "--model-file", str(model), devices=ONE_GPU, gpus=1)
    b = run_on(spec, tmp_path / "b", "--model-file", str(model), devices=ONE_GPU, gpus=1)
    assert_same_training(a, b)

    # The same model in float32: had the policy been ignored, its bits would be the same.
    single = mixed_precision_definition("float32")
    single_model = tmp_path / "float32.json"
    single_model.write_bytes(single)
    float32 = run_on(
        mixed_precision_spec(single),
        tmp_path / "float32",
        "--model-file",
        str(single_model),
        devices=ONE_GPU,
        gpus=1,
    )
    assert final_fingerprint(float32) != final_fingerprint(a)


def test_convolutions_cudnn_autotunes_rerun_bitwise_identical(
    gpu: dict[str, Any], tmp_path: Path
) -> None:
    spec = autotuned_cnn_spec()
    # Autotuning on, whatever the test process's environment says: op determinism must keep
    # the kernels it picks to deterministic ones, in every process.
    autotune = {"TF_CUDNN_USE_AUTOTUNE": "1"}
    a = run_on(spec, tmp_path / "a", devices=ONE_GPU, gpus=1, env=autotune)
    b = run_on(spec, tmp_path / "b", devices=ONE_GPU, gpus=1, env=autotune)
    assert a.provenance["environment"]["TF_CUDNN_USE_AUTOTUNE"] == "1"
    assert_same_training(a, b)
