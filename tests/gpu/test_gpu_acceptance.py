"""GPU acceptance: bitwise reruns on one GPU, TF32 as a named cause of divergence, the step
pre-flight refusing an op without a deterministic GPU kernel (a nearest-neighbour resize;
Keras 3's UpSampling2D nearest is a repeat and trains bitwise), and the GPU image under the
Docker executor identical to itself.

Jobs see one GPU (CUDA_VISIBLE_DEVICES=0): the guarantee is per GPU model and count.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from tests.integration.jobs import blobs_spec, job_request, run_job
from worker.compare.verdict import build_report, record_from_result
from worker.result import JobResult

pytestmark = pytest.mark.gpu

ONE_GPU = {"CUDA_VISIBLE_DEVICES": "0"}
GPU_IMAGE = os.environ.get("REPRO_TEST_GPU_IMAGE", "reprotrain-worker-gpu:0.1.0")
TOKENS = {
    "generator": "token_sequences",
    "params": {"vocab_size": 24, "seq_len": 10},
    "batch_size": 16,
    "train_batches": 5,
}
IMAGES = {
    "generator": "pattern_images",
    "params": {"image_size": 8},
    "batch_size": 16,
    "train_batches": 4,
}
# Every built-in architecture, small; `keras` (a stored definition) builds from the same layers.
ARCHITECTURES: dict[str, dict[str, Any]] = {
    "mlp": blobs_spec(),
    "small_cnn": blobs_spec(
        name="cnn",
        dataset=IMAGES,
        model={"architecture": "small_cnn", "params": {"filters": [4, 8], "dense": 8}},
    ),
    "tiny_transformer": blobs_spec(
        name="attn",
        dataset=TOKENS,
        model={"architecture": "tiny_transformer", "params": {"embed_dim": 8, "ff_dim": 16}},
    ),
    "gru": blobs_spec(
        name="gru",
        dataset=TOKENS,
        model={"architecture": "gru", "params": {"embed_dim": 8, "units": 8, "dropout": 0.2}},
    ),
}
# Two ways to enlarge feature maps: `Resizing` nearest runs ResizeNearestNeighbor, whose
# gradient has no deterministic GPU kernel; Keras 3's `UpSampling2D(interpolation="nearest")`
# repeats rows and columns (a Tile, whose gradient is a sum) and trains deterministically.
UPSAMPLING_MODULE = """
import keras


def _cnn(enlarge, data):
    inputs = keras.Input(shape=data.x_shape)
    h = keras.layers.Conv2D(4, 3, padding="same", name="conv")(inputs)
    h = keras.layers.GlobalAveragePooling2D(name="pool")(enlarge(h))
    return keras.Model(inputs, keras.layers.Dense(data.output_dim, name="out")(h))


def resizing_cnn(params, data):
    size = 2 * data.x_shape[0]
    return _cnn(keras.layers.Resizing(size, size, interpolation="nearest", name="upsample"), data)


def upsampling_cnn(params, data):
    return _cnn(keras.layers.UpSampling2D(interpolation="nearest", name="upsample"), data)
"""


def _on_gpu(result: JobResult) -> None:
    assert result.status == "succeeded", result.error
    assert result.provenance["tf_gpus"], "the job did not see the GPU"


@pytest.mark.parametrize("architecture", sorted(ARCHITECTURES))
def test_two_fresh_runs_on_one_gpu_are_bitwise_identical(
    gpu: dict[str, Any], architecture: str, tmp_path: Path
) -> None:
    spec = ARCHITECTURES[architecture]
    a = run_job(spec, tmp_path / "a", env=ONE_GPU).result
    b = run_job(spec, tmp_path / "b", env=ONE_GPU).result
    _on_gpu(a)
    _on_gpu(b)
    assert a.final_fingerprint == b.final_fingerprint
    assert a.trace == b.trace
    report = build_report(record_from_result(a, "a"), record_from_result(b, "b"))
    assert report["verdict"] == "identical", report.get("explanation")


def test_tf32_on_against_off_diverges_in_compute_and_names_tf32(
    gpu: dict[str, Any], tmp_path: Path
) -> None:
    # Wide float32 matmuls: TF32's 10-bit inputs change the first step's products.
    wide = blobs_spec(model={"architecture": "mlp", "params": {"hidden": [256, 256]}})
    on = run_job({**wide, "determinism": {"tf32": True}}, tmp_path / "on", env=ONE_GPU).result
    off = run_job({**wide, "determinism": {"tf32": False}}, tmp_path / "off", env=ONE_GPU).result
    _on_gpu(on)
    _on_gpu(off)
    assert on.provenance["determinism"]["tf32"] is True
    assert off.provenance["determinism"]["tf32"] is False
    report = build_report(record_from_result(on, "on"), record_from_result(off, "off"))
    if float(gpu["compute_capability"]) < 8.0:  # TF32 exists on Ampere and newer only
        assert report["verdict"] == "identical", report.get("explanation")
        return
    assert report["verdict"] == "diverged", report.get("explanation")
    assert report["cause"] == "compute"
    assert [d["path"] for d in report["spec_diff"]] == ["determinism.tf32"]
    assert "tf32" in report["explanation"]
    assert any(
        d["field"] == "determinism.tf32" and d["breaks_reproducibility"]
        for d in report["provenance_diff"]
    )


def _plugin_site(tmp_path: Path) -> Path:
    site = tmp_path / "site"
    info = site / "upsampling_plugin-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: upsampling-plugin\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(
        "[reprotrain.architectures]\n"
        "resizing_cnn = upsampling_plugin:resizing_cnn\n"
        "upsampling_cnn = upsampling_plugin:upsampling_cnn\n"
    )
    (site / "upsampling_plugin.py").write_text(UPSAMPLING_MODULE)
    return site


def test_nearest_resizing_is_refused_by_the_preflight_and_upsampling2d_trains_bitwise(
    gpu: dict[str, Any], tmp_path: Path
) -> None:
    site = _plugin_site(tmp_path)
    spec = blobs_spec(dataset=IMAGES, model={"architecture": "resizing_cnn", "params": {}})
    done = run_job(spec, tmp_path / "job", extra_paths=[site], env=ONE_GPU)
    assert done.returncode != 0
    error = done.result.error
    assert error is not None, done.stderr[-3000:]
    assert "ResizeNearestNeighborGrad" in error.message
    assert "layer 'upsample'" in error.message
    assert "UpSampling2D" in error.message  # the way around it
    assert not any(e.get("event") == "epoch_start" for e in done.events)

    upsampling = {**spec, "model": {"architecture": "upsampling_cnn", "params": {}}}
    a = run_job(upsampling, tmp_path / "a", extra_paths=[site], env=ONE_GPU).result
    b = run_job(upsampling, tmp_path / "b", extra_paths=[site], env=ONE_GPU).result
    _on_gpu(a)
    _on_gpu(b)
    assert a.final_fingerprint == b.final_fingerprint


def test_the_gpu_image_under_the_docker_executor_is_identical_to_itself(
    gpu: dict[str, Any], tmp_path: Path
) -> None:
    from worker.node.executors.docker import DockerExecutor

    executor = DockerExecutor(images=[GPU_IMAGE], allow_tag=True)
    assert executor.gpus, "Docker has no NVIDIA runtime: the job would run on the CPU"
    results = []
    for name in ("a", "b"):
        request = job_request(tmp_path / name, ARCHITECTURES["small_cnn"], name, GPU_IMAGE)
        job = executor.start(request)
        try:
            stderr = "".join(job.stderr_lines())
            assert job.wait() == 0, stderr[-3000:]
        finally:
            job.close()
        results.append(JobResult.model_validate(json.loads(request.result_path.read_text())))
    for result in results:
        _on_gpu(result)
    assert results[0].final_fingerprint == results[1].final_fingerprint
    assert results[0].provenance["image"]["id"] == results[1].provenance["image"]["id"]
