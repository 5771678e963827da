"""What `repro doctor` flags in a report, and the container its `--image` form runs in."""

from __future__ import annotations

from typing import Any

import pytest

from worker.node.readiness_probe import (
    READINESS_ARGS,
    container_options,
    job_user,
    parse_report,
    registration_flags,
)
from worker.record.readiness import flags, notes, summary_lines

A100 = {
    "index": 0,
    "name": "NVIDIA A100-SXM4-40GB",
    "compute_capability": "8.0",
    "sm_count": 108,
    "driver_version": "555.42",
}
V100 = {**A100, "index": 1, "name": "Tesla V100-SXM2-16GB", "compute_capability": "7.0"}
THREADS = {"OMP_NUM_THREADS": "4", "TF_NUM_INTRAOP_THREADS": "4", "TF_NUM_INTEROP_THREADS": "1"}


def _report(**changes: Any) -> dict[str, Any]:
    report: dict[str, Any] = {
        "gpus": [A100],
        "tensorflow": "2.21.0",
        "tensorflow_gpu_count": 1,
        "cuda": {
            "built": {"cuda": "12.5.1", "cudnn": "9"},
            "loaded": {"runtime_version": "12.5", "cudnn_version": "9.3.0"},
            "lock": {"cuda": "12.5.82", "cudnn": "9.3.0.75"},
        },
        "tf32": {"enabled": False, "NVIDIA_TF32_OVERRIDE": None, "applies": True},
        "op_determinism": {"TF_DETERMINISTIC_OPS": "1"},
        "threads": dict(THREADS),
        "environment": {},
        "probe_errors": {},
    }
    report.update(changes)
    return report


def _checks(report: dict[str, Any]) -> list[str]:
    return [f["check"] for f in flags(report)]


def test_a_machine_set_up_for_reruns_has_nothing_flagged() -> None:
    assert flags(_report()) == []
    assert "nothing flagged" in summary_lines(_report())


def test_tf32_is_flagged_only_where_a_gpu_uses_it_and_nothing_overrides_it() -> None:
    on = {"enabled": True, "NVIDIA_TF32_OVERRIDE": None, "applies": True}
    assert _checks(_report(tf32=on)) == ["tf32"]
    assert _checks(_report(tf32={**on, "NVIDIA_TF32_OVERRIDE": "0"})) == []
    assert _checks(_report(tf32={**on, "applies": False}, gpus=[V100])) == []


def test_op_determinism_off_is_flagged_and_thread_counts_left_to_the_machine_are_a_note() -> None:
    off = _report(op_determinism={"TF_DETERMINISTIC_OPS": "0"})
    assert _checks(off) == ["op_determinism"]
    assert notes(_report()) == []
    unset = _report(threads={**THREADS, "TF_NUM_INTEROP_THREADS": None})
    assert flags(unset) == []
    (note,) = notes(unset)
    assert note["check"] == "threads" and "export TF_NUM_INTEROP_THREADS=1" in note["message"]


def test_cuda_and_cudnn_other_than_the_build_and_the_lock_are_flagged() -> None:
    cuda = _report()["cuda"]
    loaded = {**cuda, "loaded": {"runtime_version": "12.4", "cudnn_version": "9.3.0"}}
    (flag,) = flags(_report(cuda=loaded))
    assert flag["check"] == "cuda" and "CUDA 12.4 is loaded" in flag["message"]
    locked = {**cuda, "lock": {"cuda": "12.5.82", "cudnn": "8.9.7.29"}}
    (flag,) = flags(_report(cuda=locked))
    assert "lock pins cuDNN 8.9.7.29" in flag["message"]
    # Without a GPU nothing loads the libraries: only the lock is compared.
    assert flags(_report(gpus=[], cuda={**loaded, "lock": None})) == []


def test_mixed_gpus_hidden_gpus_and_cudnn_variables_are_flagged() -> None:
    assert _checks(_report(gpus=[A100, V100])) == ["gpus"]
    assert _checks(_report(tensorflow_gpu_count=0)) == ["gpus"]
    steered = _report(environment={"TF_CUDNN_USE_AUTOTUNE": "0"})
    assert _checks(steered) == ["environment"]
    assert flags(_report(gpus=[], environment={"TF_CUDNN_USE_AUTOTUNE": "0"})) == []


def test_the_checks_container_follows_the_docker_executors_sandbox() -> None:
    environ = {"TF_DETERMINISTIC_OPS": "0", "OMP_NUM_THREADS": "2", "AWS_SECRET_KEY": "x"}
    options = container_options("sha256:abc", gpus=False, user="65534:65534", environ=environ)
    assert options["entrypoint"] == ["python3", *READINESS_ARGS]
    assert options["network_mode"] == "none" and options["read_only"] is True
    assert options["cap_drop"] == ["ALL"] and options["security_opt"] == ["no-new-privileges"]
    assert options["device_requests"] == []
    assert options["environment"]["TF_DETERMINISTIC_OPS"] == "0"
    assert "AWS_SECRET_KEY" not in options["environment"]
    with_gpus = container_options("sha256:abc", gpus=True, user="1000", environ={})
    (request,) = with_gpus["device_requests"]
    assert request["Count"] == -1 and request["Capabilities"] == [["gpu"]]
    assert with_gpus["environment"]["NVIDIA_DRIVER_CAPABILITIES"] == "compute,utility"
    assert job_user("root") == job_user("") == "65534:65534"
    assert job_user("1000:1000") == "1000:1000"


def test_a_report_is_read_from_the_last_line_and_cut_to_a_registrations_bounds() -> None:
    report = parse_report(
        'warning from a library\n{"flags": [{"check": "tf32", "message": "x"}]}\n'
    )
    assert report["flags"] == [{"check": "tf32", "message": "x"}]
    with pytest.raises(ValueError):
        parse_report("")
    many = {"flags": [{"check": "c" * 50, "message": "m" * 2000}] * 40}
    cut = registration_flags(many)
    assert len(cut) == 32
    assert len(cut[0]["check"]) == 40 and len(cut[0]["message"]) == 1000
