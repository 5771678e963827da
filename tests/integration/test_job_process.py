"""Real jobs in fresh processes: bitwise reruns, exact resume, and clear failures."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.integration.jobs import REPO, blobs_spec, job_env, run_job, write_spec
from worker.record.fingerprint import combine
from worker.record.trace import compare_traces
from worker.result import JobResult, read_result

pytestmark = pytest.mark.slow

TOKENS = {
    "generator": "token_sequences",
    "params": {"vocab_size": 24, "seq_len": 10},
    "batch_size": 16,
    "train_batches": 5,
}
RESUME_CASES = {
    "mlp-dropout-batchnorm": blobs_spec(),
    "small-cnn": blobs_spec(
        name="cnn",
        dataset={
            "generator": "pattern_images",
            "params": {"image_size": 8},
            "batch_size": 16,
            "train_batches": 4,
        },
        model={"architecture": "small_cnn", "params": {"filters": [4, 8], "dense": 8}},
    ),
    "tiny-transformer": blobs_spec(
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


def test_same_spec_twice_is_bitwise_identical_and_another_seed_is_not(tmp_path: Path) -> None:
    spec = blobs_spec(training={**blobs_spec()["training"], "fingerprint_every_steps": 4})
    a = run_job(spec, tmp_path / "a")
    b = run_job(spec, tmp_path / "b")
    assert a.returncode == 0 and b.returncode == 0, a.result.error
    ra, rb = a.result, b.result
    assert ra.status == rb.status == "succeeded"
    assert ra.final_fingerprint == rb.final_fingerprint
    assert ra.trace == rb.trace
    assert [p.kind for p in ra.trace].count("step") == 6  # 24 steps, one point every 4
    assert ra.data_fingerprints == rb.data_fingerprints
    assert ra.eval_data_fingerprint == rb.eval_data_fingerprint
    assert compare_traces(ra.trace, rb.trace).identical
    # Optimizer state and the dropout seed-generator state are part of the fingerprint.
    paths = list(ra.trace[-1].variables)
    assert "optimizer/adam/iteration" in paths
    assert any("seed_generator_state" in p for p in paths)
    assert any("moving_variance" in p for p in paths)

    c = run_job(blobs_spec(seed=1235, training=spec["training"]), tmp_path / "c")
    rc = c.result
    assert rc.status == "succeeded" and rc.final_fingerprint != ra.final_fingerprint
    assert all(
        x.fingerprint != y.fingerprint
        for x, y in zip(rc.data_fingerprints, ra.data_fingerprints, strict=True)
    )
    comparison = compare_traces(ra.trace, rc.trace)
    assert comparison.first_divergence is not None
    assert comparison.first_divergence.point.kind == "init"


def test_seed_001_experiment_reproduces_across_processes(tmp_path: Path) -> None:
    spec = REPO / "examples" / "seed001.yaml"
    a = run_job(spec, tmp_path / "a")
    b = run_job(spec, tmp_path / "b")
    assert a.returncode == b.returncode == 0, a.result.error
    assert a.result.final_fingerprint == b.result.final_fingerprint
    assert a.result.trace == b.result.trace
    final = a.result.trace[-1]
    assert list(final.variables)[:4] == [
        "model/dense_0/kernel",
        "model/dense_0/bias",
        "model/output/kernel",
        "model/output/bias",
    ]
    assert [m["epoch"] for m in a.result.metrics] == [1, 2, 3]
    assert final.step == 21  # 3 epochs of 7 batches of 16


@pytest.mark.parametrize("case", sorted(RESUME_CASES))
def test_half_then_resume_equals_uninterrupted(case: str, tmp_path: Path) -> None:
    spec = RESUME_CASES[case]
    full = run_job(spec, tmp_path / "full")
    assert full.returncode == 0, full.result.error
    ckpt = tmp_path / "ckpt"
    half = run_job(
        spec, tmp_path / "half", "--checkpoint-dir", str(ckpt), "--stop-after-epoch", "2"
    )
    assert half.returncode == 3 and half.result.status == "interrupted"
    assert half.result.interrupted_after_epoch == 2 and half.result.final_fingerprint is None
    resumed = run_job(spec, tmp_path / "resumed", "--checkpoint-dir", str(ckpt), "--resume")
    assert resumed.returncode == 0, resumed.result.error
    assert resumed.result.resumed_from_epoch == 2
    assert resumed.result.final_fingerprint == full.result.final_fingerprint
    assert resumed.result.trace == full.result.trace
    assert resumed.result.data_fingerprints == full.result.data_fingerprints
    assert [m["epoch"] for m in resumed.result.metrics] == [1, 2, 3, 4]
    # The per-step losses: one a step (a short run), bitwise those of the run not stopped.
    steps = spec["training"]["epochs"] * spec["dataset"]["train_batches"]
    assert [r["step"] for r in full.result.step_metrics] == list(range(1, steps + 1))
    assert resumed.result.step_metrics == full.result.step_metrics


def _sigterm_at_epoch_start(spec: dict[str, Any], tmp_path: Path, *args: str) -> JobResult:
    """Run `spec`, send SIGTERM as epoch 2 starts; the result of the job, exit code 3."""
    out = tmp_path / "result.json"
    with subprocess.Popen(
        [
            sys.executable,
            "-m",
            "worker.run",
            "--spec",
            str(write_spec(spec, tmp_path)),
            "--out",
            str(out),
            *args,
        ],
        env=job_env(),
        stderr=subprocess.PIPE,
        text=True,
    ) as proc:
        assert proc.stderr is not None
        for line in proc.stderr:
            if line.startswith('@repro {"event":"epoch_start","epoch":2'):
                proc.send_signal(signal.SIGTERM)
                break
        proc.stderr.read()
        assert proc.wait(timeout=120) == 3
    return read_result(out)


def test_sigterm_checkpoints_the_next_step_and_resume_finishes_identically(
    tmp_path: Path,
) -> None:
    # 40 steps an epoch: the signal is seen after the call running when it lands, long
    # before the epoch ends. A step checkpoint is written there, though the spec asks for
    # none, and no trace point: the resumed run's trace is the uninterrupted one's.
    spec = blobs_spec(
        dataset={**blobs_spec()["dataset"], "train_batches": 40},
        training={**blobs_spec()["training"], "epochs": 3, "fingerprint_every_steps": 10},
    )
    ckpt = tmp_path / "ckpt"
    stopped = _sigterm_at_epoch_start(spec, tmp_path, "--checkpoint-dir", str(ckpt))
    at = stopped.interrupted_at_step
    assert stopped.status == "interrupted" and stopped.interrupted_after_epoch is None
    assert at is not None and 40 < at < 80, at
    assert stopped.checkpoints[-1].endswith(f"step-{at:09d}.json")
    assert stopped.trace[-1].step <= at and stopped.final_fingerprint is None
    assert [d.epoch for d in stopped.data_fingerprints] == [1]  # the epochs trained whole
    resumed = run_job(spec, tmp_path / "resumed", "--checkpoint-dir", str(ckpt), "--resume")
    full = run_job(spec, tmp_path / "full")
    assert resumed.returncode == full.returncode == 0, resumed.result.error
    assert resumed.result.resumed_from_step == at and resumed.result.resumed_from_epoch is None
    assert resumed.result.final_fingerprint == full.result.final_fingerprint
    assert resumed.result.trace == full.result.trace
    assert resumed.result.data_fingerprints == full.result.data_fingerprints
    assert resumed.result.step_metrics == full.result.step_metrics


def test_sigterm_without_checkpoints_ends_at_the_epoch(tmp_path: Path) -> None:
    # Nowhere to resume from a step: the job finishes the epoch, then stops.
    spec = blobs_spec(training={**blobs_spec()["training"], "epochs": 5})
    stopped = _sigterm_at_epoch_start(spec, tmp_path)
    assert stopped.status == "interrupted" and stopped.interrupted_after_epoch == 2
    assert stopped.interrupted_at_step is None and stopped.trace[-1].epoch == 2


def test_trace_comparison_of_real_runs_finds_a_planted_divergence(tmp_path: Path) -> None:
    run = run_job(blobs_spec(), tmp_path / "a")
    trace = [p.model_dump() for p in run.result.trace]
    planted = json.loads(json.dumps(trace))
    variable = "model/dense_1/kernel"
    for point in planted:
        if point["epoch"] >= 3:
            point["variables"][variable] = "00" * 32
            point["fingerprint"] = combine(point["variables"].items())
    result = compare_traces(trace, planted)
    assert result.first_divergence is not None
    assert (result.first_divergence.point.kind, result.first_divergence.point.epoch) == ("epoch", 3)
    assert result.first_divergence.variables == [variable]


def test_null_seed_is_generated_recorded_and_replayable(tmp_path: Path) -> None:
    first = run_job(blobs_spec(seed=None), tmp_path / "a")
    assert first.result.seed_source == "generated" and first.result.seed is not None
    assert first.result.spec is not None and first.result.spec["seed"] == first.result.seed
    again = run_job(blobs_spec(seed=first.result.seed), tmp_path / "b")
    assert again.result.final_fingerprint == first.result.final_fingerprint
    assert again.result.spec_hash == first.result.spec_hash


def test_progress_and_provenance_are_reported(tmp_path: Path) -> None:
    run = run_job(blobs_spec(), tmp_path)
    kinds = [e["event"] for e in run.events]
    assert kinds[0] == "started" and kinds[-1] == "finished"
    assert kinds.count("epoch_end") == 4 and "step" in kinds
    step = next(e for e in run.events if e["event"] == "step")
    assert {"epoch", "batch", "batches", "step", "loss"} <= set(step)
    prov = run.result.provenance
    assert prov["spec_hash"] == run.result.spec_hash
    assert prov["libraries"]["tensorflow"] == "2.21.0"
    assert prov["determinism"]["op_determinism"] is True
    assert prov["environment"]["PYTHONHASHSEED"] == "0"
    assert prov["packages"]["digest"].startswith("sha256:")
    assert run.result.timings["training"] > 0


# --- bad input: a clear error, a result document, a telling exit code ---------------------


def test_invalid_spec_writes_a_failed_result_with_field_paths(tmp_path: Path) -> None:
    bad = blobs_spec(dataset={**blobs_spec()["dataset"], "batch_size": -1})
    run = run_job(bad, tmp_path)
    assert run.returncode == 2
    assert run.result.status == "failed" and run.result.error is not None
    assert run.result.error.phase == "spec"
    assert {"loc": "dataset.batch_size", "msg": "Input should be greater than or equal to 1"} in (
        run.result.error.errors
    )


def test_malformed_yaml_and_unknown_names_are_spec_errors(tmp_path: Path) -> None:
    run = run_job("name: [unclosed", tmp_path / "yaml")
    assert run.returncode == 2 and "malformed" in (
        run.result.error.message if run.result.error else ""
    )
    unknown = blobs_spec(model={"architecture": "resnet50"})
    run = run_job(unknown, tmp_path / "name")
    assert run.returncode == 2 and run.result.error is not None
    assert "unknown architecture 'resnet50'" in run.result.error.message
    assert "tiny_transformer" in run.result.error.message


def test_training_errors_are_captured_with_traceback(tmp_path: Path) -> None:
    # A CNN on flat feature vectors cannot be built: the job fails, its result says why.
    spec = blobs_spec(model={"architecture": "small_cnn"})
    run = run_job(spec, tmp_path)
    assert run.returncode == 1 and run.result.error is not None
    assert run.result.error.type == "ArchitectureError"
    assert "small_cnn needs images" in run.result.error.message
    assert "Traceback" in (run.result.error.traceback or "")


@pytest.fixture
def plugin_paths(tmp_path: Path) -> list[Path]:
    from tests.plugin_dist import PLUGIN_DIR, make_plugin_site

    return [make_plugin_site(tmp_path / "site"), PLUGIN_DIR]


def test_stateful_generator_under_op_determinism_is_refused_by_name(
    tmp_path: Path, plugin_paths: list[Path]
) -> None:
    spec = blobs_spec(
        dataset={**blobs_spec()["dataset"], "generator": "stateful_noise", "params": {}}
    )
    run = run_job(spec, tmp_path / "on", extra_paths=plugin_paths)
    assert run.returncode == 1 and run.result.error is not None
    assert run.result.error.type == "GeneratorError"
    assert "generator 'stateful_noise'" in run.result.error.message
    assert "RandomUniform" in run.result.error.message
    off: dict[str, Any] = {**spec, "determinism": {"op_determinism": False}}
    run = run_job(off, tmp_path / "off", extra_paths=plugin_paths)
    assert run.returncode == 0, run.result.error
    assert any("stateful_noise" in w and "not reproducible" in w for w in run.result.warnings)


def test_wrong_generator_structure_is_named(tmp_path: Path, plugin_paths: list[Path]) -> None:
    spec = blobs_spec(
        dataset={**blobs_spec()["dataset"], "generator": "scalar_output", "params": {}}
    )
    run = run_job(spec, tmp_path, extra_paths=plugin_paths)
    assert run.returncode == 1 and run.result.error is not None
    assert run.result.error.type == "GeneratorError"
    assert "'scalar_output'" in run.result.error.message


def test_plugin_architecture_trains_reproducibly(tmp_path: Path, plugin_paths: list[Path]) -> None:
    spec = blobs_spec(model={"architecture": "wide_mlp", "params": {"width": 12}})
    a = run_job(spec, tmp_path / "a", extra_paths=plugin_paths)
    b = run_job(spec, tmp_path / "b", extra_paths=plugin_paths)
    assert a.returncode == b.returncode == 0, a.result.error
    assert a.result.final_fingerprint == b.result.final_fingerprint


def test_a_model_drawing_stateful_random_numbers_is_reseeded_every_epoch_and_warned(
    tmp_path: Path, plugin_paths: list[Path]
) -> None:
    spec = blobs_spec(model={"architecture": "noisy_mlp", "params": {}})
    a = run_job(spec, tmp_path / "a", extra_paths=plugin_paths)
    b = run_job(spec, tmp_path / "b", extra_paths=plugin_paths)
    assert a.returncode == b.returncode == 0, a.result.error
    assert a.result.trace == b.result.trace
    assert "RandomUniform" in a.result.determinism["reseed_tensorflow"]
    # Its op seeds are fixed when the step is compiled, which a resumed job does in another
    # epoch: the user is told, rather than promised a bitwise resume.
    assert any("stateful RNG ops (RandomUniform)" in w for w in a.result.warnings)
    plain = run_job(blobs_spec(), tmp_path / "plain")
    assert plain.result.determinism["reseed_tensorflow"].startswith("at start only")
    assert not any("stateful RNG" in w for w in plain.result.warnings)


def test_operator_limit_on_model_parameters_fails_the_job_clearly(tmp_path: Path) -> None:
    run = run_job(blobs_spec(), tmp_path, "--max-model-parameters", "100")
    assert run.returncode == 1 and run.result.error is not None
    assert run.result.error.type == "ArchitectureError"
    assert "parameters; this server allows at most 100" in run.result.error.message


def test_a_job_ends_without_the_teardown_yet_with_its_output_and_exit_handlers(
    tmp_path: Path,
) -> None:
    """The job's process skips the interpreter's teardown, not what must happen first: its
    last progress event is out, its exit code says how it ended, and exit handlers ran (the
    private directory a code bundle was installed into is gone)."""
    import hashlib

    import yaml

    from tests.code_wheels import ring_bundle, ring_spec

    wheel = ring_bundle()
    code_file = tmp_path / "code" / "ring_bundle-1.0-py3-none-any.whl"
    code_file.parent.mkdir()
    code_file.write_bytes(wheel)
    spec = yaml.safe_load(ring_spec("sha256:" + hashlib.sha256(wheel).hexdigest()))
    spec["training"]["epochs"] = 1
    private_tmp = tmp_path / "tmp"
    private_tmp.mkdir()
    run = run_job(
        spec,
        tmp_path / "job",
        "--code-file",
        str(code_file),
        env={"TMPDIR": str(private_tmp)},
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.result.status == "succeeded"
    assert run.events[-1]["event"] == "finished" and run.events[-1]["status"] == "succeeded"
    assert list(private_tmp.iterdir()) == []
