"""The GPU suite's helpers, on the CPU: the specs it trains validate and say what the suite
claims of them, the positive control's verdict, the parsing of `nvidia-smi -L`, and running
a job and reading its fingerprint (real jobs, on the CPU)."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.gpu.gpu_jobs import (
    FingerprintPair,
    assert_same_training,
    checked_result,
    control_verdict,
    final_fingerprint,
    run_on,
    run_until_differ,
)
from tests.gpu.gpu_specs import (
    IMAGE_CLASSES,
    MIXED_FLOAT16,
    OUTPUT_LAYER,
    RESUME_STOP_AFTER_EPOCH,
    attention_spec,
    autotuned_cnn_spec,
    conv_spec,
    embedding_control_spec,
    mixed_precision_definition,
    mixed_precision_spec,
    replicas_spec,
    resume_spec,
    xla_clusters,
    xla_environment,
)
from tests.gpu.nvidia_smi import (
    ListedGpu,
    MigDevice,
    describe,
    list_gpus,
    parse_gpu_list,
    visible_devices,
    whole_gpus,
)
from tests.integration.jobs import Finished, blobs_spec
from worker.models import keras_definition as kd
from worker.models import registry
from worker.record.library_versions import parse_xla_flags
from worker.spec import ExperimentSpec, parse_spec

A100_0 = "GPU-5d5ba0d6-d33d-2b2c-524d-9e3d8d2b8a77"
A100_1 = "GPU-0c3f7a1e-8b4d-4f2a-9c61-2e7d5b8a9f10"
TWO_A100 = (
    f"GPU 0: NVIDIA A100-SXM4-40GB (UUID: {A100_0})\n"
    f"GPU 1: NVIDIA A100-SXM4-40GB (UUID: {A100_1})\n"
)
MIG_0 = "MIG-2bbd1b3a-4f8e-5a6b-9c0d-1e2f3a4b5c6d"
MIG_1 = "MIG-7e6d5c4b-3a29-5817-a6b5-c4d3e2f1a0b9"
ONE_SPLIT_ONE_WHOLE = (
    f"GPU 0: NVIDIA A100-SXM4-40GB (UUID: {A100_0})\n"
    f"  MIG 1g.5gb      Device  0: (UUID: {MIG_0})\n"
    f"  MIG 1g.5gb Device 1: (UUID: {MIG_1})\n"
    f"GPU 1: NVIDIA A100-SXM4-40GB (UUID: {A100_1})\n"
)

SPECS = {
    "control-off": embedding_control_spec(op_determinism=False),
    "control-on": embedding_control_spec(op_determinism=True),
    "resume": resume_spec(),
    "replicas": replicas_spec(2),
    "autotuned": autotuned_cnn_spec(),
    "xla-cnn": conv_spec("xla-cnn", filters=[8, 16]),
    "xla-attention": attention_spec("xla-attention"),
    "mixed": mixed_precision_spec(mixed_precision_definition()),
}


def _checked(spec: dict[str, Any]) -> ExperimentSpec:
    """The spec as the API and the job check it: fields, then components and params."""
    parsed = parse_spec(spec)
    registry.check_spec(parsed)
    return parsed


# --- the specs --------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(SPECS))
def test_every_spec_of_the_gpu_suite_validates_as_the_api_and_the_job_check_it(
    name: str,
) -> None:
    parsed = _checked(SPECS[name])
    assert parsed.spec_hash().startswith("sha256:")


def test_the_control_runs_differ_from_the_deterministic_ones_in_op_determinism_only() -> None:
    off = _checked(embedding_control_spec(op_determinism=False))
    on = _checked(embedding_control_spec(op_determinism=True))
    assert off.determinism.op_determinism is False and on.determinism.op_determinism is True
    assert off.model_copy(update={"determinism": on.determinism}) == on
    # Many tokens a batch share few embedding rows: each row's gradient sums thousands.
    assert off.model.architecture == "tiny_transformer"
    tokens = off.dataset.batch_size * off.dataset.params["seq_len"]
    assert tokens // off.dataset.params["vocab_size"] >= 1000


def test_the_resumed_run_has_epochs_after_the_one_it_stops_at() -> None:
    parsed = _checked(resume_spec())
    assert parsed.training.epochs > RESUME_STOP_AFTER_EPOCH
    assert parsed.model.architecture == "small_cnn"  # convolutions cuDNN picks kernels for


def test_the_replicas_spec_splits_each_batch_evenly_over_two_devices() -> None:
    parsed = _checked(replicas_spec(2))
    assert parsed.distribution.replicas == 2
    assert parsed.dataset.batch_size % 2 == 0


def test_the_autotuned_convolutions_are_wide_on_32x32_images_in_large_batches() -> None:
    parsed = _checked(autotuned_cnn_spec())
    filters = parsed.model.params["filters"]
    assert parsed.model.architecture == "small_cnn"
    assert len(filters) >= 3 and all(f >= 64 for f in filters)
    assert parsed.dataset.batch_size >= 64
    info = registry.sample_info(parsed)
    assert info is not None and info.x_shape == (32, 32, 3)


def _policies(definition: bytes) -> dict[str, str]:
    config = json.loads(definition)
    return {
        layer["config"]["name"]: layer["config"]["dtype"]["config"]["name"]
        for layer in config["config"]["layers"]
        if layer["class_name"] != "InputLayer"
    }


def test_the_mixed_precision_definition_passes_the_jobs_checks_with_float16_layers() -> None:
    definition = mixed_precision_definition()
    info = kd.read_definition(definition)  # the allow-list the API and the job apply
    spec = _checked(mixed_precision_spec(definition))
    assert spec.model.architecture == "keras"
    assert spec.model.definition == kd.digest_of(definition)
    data = registry.sample_info(spec)
    assert data is not None
    kd.check_fits(info, data)
    assert info.output_units == IMAGE_CLASSES
    policies = _policies(definition)
    assert policies.pop(OUTPUT_LAYER) == "float32"
    assert len(policies) > 60 and set(policies.values()) == {MIXED_FLOAT16}
    single = _policies(mixed_precision_definition("float32"))
    assert set(single.values()) == {"float32"} and single.keys() == _policies(definition).keys()


def test_keras_builds_the_mixed_definition_computing_in_float16_with_float32_weights() -> None:
    import keras

    model = keras.saving.deserialize_keras_object(
        kd.read_definition(mixed_precision_definition()).config, safe_mode=True
    )
    convolutions = [la for la in model.layers if isinstance(la, keras.layers.Conv2D)]
    assert len(convolutions) == 21
    for layer in convolutions:
        assert layer.compute_dtype == "float16" and layer.variable_dtype == "float32"
    output = model.get_layer(OUTPUT_LAYER)
    assert output.compute_dtype == "float32"
    assert model.output.dtype == "float32"


def test_the_xla_environment_turns_on_auto_clustering_and_dumps_modules(tmp_path: Path) -> None:
    env = xla_environment(tmp_path / "dump")
    # Read as the job's provenance and `repro doctor` read them.
    assert parse_xla_flags(env["TF_XLA_FLAGS"]) == {"tf_xla_auto_jit": "2"}
    assert parse_xla_flags(env["XLA_FLAGS"]) == {"xla_dump_to": str(tmp_path / "dump")}
    assert xla_clusters(tmp_path / "dump") == []  # nothing compiled, not even the directory


def test_xla_clusters_are_the_auto_clustered_modules_only(tmp_path: Path) -> None:
    stem = "cluster_3__XlaCompiledKernel_true__XlaNumResourceArgs_0_.2"
    for name in (
        f"module_0007.{stem}.before_optimizations.txt",
        f"module_0007.{stem}.sm_80_gpu_after_optimizations.txt",
        "module_0001.a_inference_generator_12.before_optimizations.txt",
    ):
        (tmp_path / name).write_text("HloModule\n")
    assert xla_clusters(tmp_path) == [stem]


# --- the positive control's verdict -------------------------------------------------------


def test_the_control_fails_when_every_pair_of_runs_is_identical() -> None:
    verdict = control_verdict([("blake3:aa", "blake3:aa")] * 3)
    assert verdict.passed is False
    assert "all 3 pair(s)" in verdict.reason and "blake3:aa" in verdict.reason


def test_the_control_passes_when_one_pair_differs() -> None:
    verdict = control_verdict([("blake3:aa", "blake3:aa"), ("blake3:aa", "blake3:bb")])
    assert verdict.passed is True
    assert verdict.reason == "pair 2 of 2 ended with different fingerprints"


@pytest.mark.parametrize(
    "pairs", [[], [("blake3:aa", None)], [("blake3:aa", "blake3:bb"), (None, None)]]
)
def test_the_control_has_no_verdict_without_pairs_or_with_a_run_without_a_fingerprint(
    pairs: list[FingerprintPair],
) -> None:
    with pytest.raises(ValueError):
        control_verdict(pairs)


def _recorded(
    pairs: list[FingerprintPair],
) -> tuple[list[int], Callable[[int], FingerprintPair]]:
    """(the pairs run, a run_pair giving `pairs` in turn)."""
    ran: list[int] = []

    def run_pair(i: int) -> FingerprintPair:
        ran.append(i)
        return pairs[i]

    return ran, run_pair


def test_pairs_are_run_until_one_differs() -> None:
    ran, run_pair = _recorded([("x", "x"), ("x", "y"), ("x", "x")])
    verdict = run_until_differ(run_pair, tries=3)
    assert verdict.passed and ran == [0, 1]


def test_all_tries_run_when_no_pair_differs_and_the_control_fails() -> None:
    ran, run_pair = _recorded([("x", "x")] * 4)
    verdict = run_until_differ(run_pair, tries=3)
    assert not verdict.passed and ran == [0, 1, 2]


def test_a_run_without_a_fingerprint_stops_the_control_without_a_verdict() -> None:
    ran, run_pair = _recorded([("x", "x"), (None, "x"), ("x", "y")])
    with pytest.raises(ValueError, match=r"pair\(s\) \[1\]"):
        run_until_differ(run_pair, tries=3)
    assert ran == [0, 1]
    with pytest.raises(ValueError, match="at least 1"):
        run_until_differ(run_pair, tries=0)


# --- nvidia-smi -L ----------------------------------------------------------------------


def test_whole_gpus_are_read_from_nvidia_smi_list() -> None:
    gpus = parse_gpu_list(TWO_A100)
    assert gpus == [
        ListedGpu(0, "NVIDIA A100-SXM4-40GB", A100_0),
        ListedGpu(1, "NVIDIA A100-SXM4-40GB", A100_1),
    ]
    assert whole_gpus(gpus) == gpus


def test_a_gpu_split_into_mig_devices_lists_them_and_is_not_whole() -> None:
    gpus = parse_gpu_list(ONE_SPLIT_ONE_WHOLE)
    assert [g.index for g in gpus] == [0, 1]
    assert gpus[0].mig_devices == (MigDevice("1g.5gb", 0, MIG_0), MigDevice("1g.5gb", 1, MIG_1))
    assert gpus[1].mig_devices == ()
    assert [g.uuid for g in whole_gpus(gpus)] == [A100_1]


def test_mig_devices_named_as_drivers_before_r470_named_them_are_read() -> None:
    old = f"  MIG 3g.20gb Device 0: (UUID: MIG-{A100_0}/1/0)"
    gpus = parse_gpu_list(f"GPU 0: NVIDIA A100-SXM4-40GB (UUID: {A100_0})\n{old}\n")
    assert gpus[0].mig_devices == (MigDevice("3g.20gb", 0, f"MIG-{A100_0}/1/0"),)


@pytest.mark.parametrize("text", ["", "\n", "No devices were found\n"])
def test_a_listing_without_gpus_has_none(text: str) -> None:
    assert parse_gpu_list(text) == []


@pytest.mark.parametrize(
    "text",
    [
        f"  MIG 1g.5gb Device 0: (UUID: {MIG_0})\n",  # a MIG device of no GPU
        f"GPU 0: NVIDIA A100-SXM4-40GB (UUID: {A100_0})\nMIG 1g.5gb Device 0: (UUID: {MIG_0})\n",
        "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.\n",
        "GPU 0: NVIDIA A100-SXM4-40GB\n",  # no UUID
    ],
)
def test_a_line_that_is_neither_a_gpu_nor_its_mig_device_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match="not a line of `nvidia-smi -L`"):
        parse_gpu_list(text)


def test_visible_devices_name_gpus_by_uuid_in_order() -> None:
    gpus = parse_gpu_list(TWO_A100)
    assert visible_devices(gpus) == f"{A100_0},{A100_1}"
    assert visible_devices(gpus[1:]) == A100_1
    with pytest.raises(ValueError):
        visible_devices([])


def test_the_listing_is_described_with_its_count_of_whole_gpus() -> None:
    assert describe([]) == "no GPU"
    assert describe(parse_gpu_list(ONE_SPLIT_ONE_WHOLE)) == (
        "1 whole GPU(s): GPU 0 (NVIDIA A100-SXM4-40GB) split into 2 MIG device(s); "
        "GPU 1 (NVIDIA A100-SXM4-40GB)"
    )


def _printing(text: str, code: int = 0) -> list[str]:
    """A command that prints `text` and exits with `code`, as nvidia-smi would."""
    return [sys.executable, "-c", f"import sys; sys.stdout.write({text!r}); sys.exit({code})"]


def test_gpus_are_listed_from_the_commands_output() -> None:
    assert list_gpus(_printing(ONE_SPLIT_ONE_WHOLE)) == parse_gpu_list(ONE_SPLIT_ONE_WHOLE)


def test_a_failing_or_missing_nvidia_smi_is_an_error_not_zero_gpus(tmp_path: Path) -> None:
    failed = "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver."
    with pytest.raises(RuntimeError, match=r"exited with 9: NVIDIA-SMI has failed"):
        list_gpus(_printing(failed, 9))
    with pytest.raises(RuntimeError, match="not found"):
        list_gpus([str(tmp_path / "nvidia-smi"), "-L"])


# --- running jobs and reading their fingerprints (real jobs, on the CPU) -----------------

NO_GPU = ""  # CUDA_VISIBLE_DEVICES hiding every GPU, on a machine that has none anyway


def _short(**changes: Any) -> dict[str, Any]:
    return blobs_spec(training={**blobs_spec()["training"], "epochs": 2}, **changes)


@pytest.mark.slow
def test_identical_reruns_give_one_fingerprint_and_pass_as_the_same_training(
    tmp_path: Path,
) -> None:
    a = run_on(_short(), tmp_path / "a", devices=NO_GPU, gpus=0)
    b = run_on(_short(), tmp_path / "b", devices=NO_GPU, gpus=0)
    assert final_fingerprint(a).startswith("blake3:")
    assert final_fingerprint(a) == final_fingerprint(b)
    assert_same_training(a, b)
    assert a.provenance["environment"]["CUDA_VISIBLE_DEVICES"] == NO_GPU


@pytest.mark.slow
def test_runs_of_another_seed_do_not_pass_as_the_same_training(tmp_path: Path) -> None:
    a = run_on(_short(), tmp_path / "a", devices=NO_GPU, gpus=0)
    b = run_on(_short(seed=4321), tmp_path / "b", devices=NO_GPU, gpus=0)
    with pytest.raises(AssertionError):
        assert_same_training(a, b)


@pytest.mark.slow
def test_a_run_is_refused_when_it_saw_other_gpus_or_ended_otherwise(tmp_path: Path) -> None:
    args = ("--checkpoint-dir", str(tmp_path / "checkpoints"), "--stop-after-epoch", "1")
    result = run_on(_short(), tmp_path / "job", *args, devices=NO_GPU, gpus=0, status="interrupted")
    assert result.interrupted_after_epoch == 1
    done = Finished(3, result, [], "")
    with pytest.raises(AssertionError, match=r"TensorFlow saw 0 GPU\(s\), not 1"):
        checked_result(done, gpus=1, status="interrupted")
    with pytest.raises(AssertionError, match="ended 'interrupted', not 'succeeded'"):
        checked_result(done, gpus=0)
    with pytest.raises(AssertionError, match="has no final fingerprint"):
        final_fingerprint(result)


@pytest.mark.slow
def test_the_xla_environment_makes_tensorflow_compile_the_steps_into_clusters(
    tmp_path: Path,
) -> None:
    env = xla_environment(tmp_path / "dump")
    # On a CPU auto-clustering also needs the CPU's switch; on a GPU the GPU's ops cluster.
    env["TF_XLA_FLAGS"] += " --tf_xla_cpu_global_jit"
    result = run_on(_short(), tmp_path / "job", devices=NO_GPU, gpus=0, env=env)
    assert result.provenance["environment"]["XLA_FLAGS"] == env["XLA_FLAGS"]
    clusters = xla_clusters(tmp_path / "dump")
    assert clusters and all(c.startswith("cluster_") for c in clusters)
