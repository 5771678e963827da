"""Tests for environment provenance capture and the ctypes GPU probe."""

from __future__ import annotations

import _ctypes
import ctypes
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import keras
import numpy
import pytest
import tensorflow as tf

from worker.record import gpu_info, provenance

TOP_LEVEL_KEYS = {
    "spec_hash",
    "hardware",
    "seed",
    "package",
    "image",
    "python",
    "libraries",
    "cuda",
    "gpus",
    "tf_gpus",
    "cpu",
    "os",
    "threads",
    "determinism",
    "environment",
    "environment_digests",
    "packages",
    "captured_at",
    "probe_errors",
}
SHA256 = re.compile(r"^sha256:[0-9a-f]{64}$")
CPUINFO = """processor\t: 0
model name\t: Example CPU @ 3.00GHz
flags\t\t: fpu sse2 avx2 avx512f
processor\t: 1
model name\t: Example CPU @ 3.00GHz
flags\t\t: fpu sse2 avx2 avx512f
"""


def _driver_loadable() -> bool:
    try:
        ctypes.CDLL(gpu_info.LIBCUDA_NAME)
    except OSError:
        return False
    return True


@pytest.fixture(scope="module")
def captured() -> dict[str, Any]:
    return provenance.capture_provenance(
        spec_hash="abc123", seed=(7, 11), determinism={"op_determinism": True, "xla": False}
    )


def test_relevant_environment_keeps_values_of_numeric_settings_only() -> None:
    environ = {
        "OMP_NUM_THREADS": "4",
        "TF_DETERMINISTIC_OPS": "1",
        "TF_ENABLE_ONEDNN_OPTS": "0",
        "PYTHONHASHSEED": "0",
        "CUBLAS_WORKSPACE_CONFIG": ":4096:8",
        "REPRO_IMAGE_REF": "reprotrain/worker:1",
        "HOME": "/root",
        "PATH": "/usr/bin",
        "PYTHONPATH": "/work",
        "MY_TF_SETTING": "x",
        "TFHUB_CACHE_DIR": "/cache",
    }
    assert provenance.relevant_environment(environ) == {
        "CUBLAS_WORKSPACE_CONFIG": ":4096:8",
        "OMP_NUM_THREADS": "4",
        "PYTHONHASHSEED": "0",
        "TF_DETERMINISTIC_OPS": "1",
        "TF_ENABLE_ONEDNN_OPTS": "0",
    }


def test_relevant_environment_result_is_sorted() -> None:
    kept = provenance.relevant_environment({"TF_GPU_B": "1", "OMP_A": "2", "CUDA_C": "3"})
    assert list(kept) == ["CUDA_C", "OMP_A", "TF_GPU_B"]


@pytest.mark.parametrize(
    "name",
    ["REPRO_API_TOKEN", "REPRO_DB_PASSWORD", "TF_SECRET", "CUDA_LICENSE_KEY", "repro_api_key"],
)
def test_relevant_environment_never_records_secret_names(name: str) -> None:
    assert provenance.relevant_environment({name: "hunter2", "OMP_NUM_THREADS": "1"}) == {
        "OMP_NUM_THREADS": "1"
    }


def test_relevant_environment_masks_credentials_inside_urls() -> None:
    kept = provenance.relevant_environment({"TF_CONFIG": "postgres://u:pw@db:5432/x"})
    assert kept == {"TF_CONFIG": "postgres://***@db:5432/x"}


def test_relevant_environment_defaults_to_process_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    monkeypatch.setenv("REPRO_UPLOAD_TOKEN", "secret-value")
    kept = provenance.relevant_environment()
    assert kept["OMP_NUM_THREADS"] == "3"
    assert "REPRO_UPLOAD_TOKEN" not in kept


def test_package_digest_of_installed_distributions_is_stable() -> None:
    first = provenance.package_set_digest()
    second = provenance.package_set_digest()
    assert first == second
    assert SHA256.match(first["digest"])
    assert first["count"] > 0


def test_package_digest_ignores_order_duplicates_and_name_spelling() -> None:
    base = provenance.package_set_digest(packages=[("numpy", "2.4.6"), ("Typing_Extensions", "4")])
    shuffled = provenance.package_set_digest(
        packages=[("typing-extensions", "4"), ("NumPy", "2.4.6"), ("numpy", "2.4.6")]
    )
    assert base == shuffled
    assert base["count"] == len({"numpy", "typing-extensions"})


def test_package_digest_changes_when_the_package_set_changes() -> None:
    base = provenance.package_set_digest(packages=[("numpy", "2.4.6"), ("blake3", "1.0.11")])
    bumped = provenance.package_set_digest(packages=[("numpy", "2.4.7"), ("blake3", "1.0.11")])
    added = provenance.package_set_digest(
        packages=[("numpy", "2.4.6"), ("blake3", "1.0.11"), ("six", "1.17.0")]
    )
    assert base["digest"] != bumped["digest"]
    assert base["digest"] != added["digest"]
    assert bumped["digest"] != added["digest"]
    assert added["count"] == base["count"] + 1


def test_flatten_provenance_uses_dotted_keys() -> None:
    flat = provenance.flatten_provenance(
        {
            "libraries": {"tensorflow": "2.21.0"},
            "gpus": [{"name": "A100", "uuid": None}],
            "environment": {"OMP_NUM_THREADS": "4"},
            "seed": [1, 2],
            "tf_gpus": [],
            "spec_hash": "h",
        }
    )
    assert flat == {
        "libraries.tensorflow": "2.21.0",
        "gpus.0.name": "A100",
        "gpus.0.uuid": None,
        "environment.OMP_NUM_THREADS": "4",
        "seed.0": 1,
        "seed.1": 2,
        "tf_gpus": [],
        "spec_hash": "h",
    }


def test_cpu_info_parses_model_and_flags() -> None:
    info = provenance.cpu_info(cpuinfo_text=CPUINFO)
    assert info["model"] == "Example CPU @ 3.00GHz"
    assert info["logical_cores"] == os.cpu_count()
    assert SHA256.match(info["flags_digest"])


def test_cpu_flags_digest_ignores_order_but_not_content() -> None:
    reordered = CPUINFO.replace("fpu sse2 avx2 avx512f", "avx512f fpu avx2 sse2")
    without_avx512 = CPUINFO.replace(" avx512f", "")
    digest = provenance.cpu_info(cpuinfo_text=CPUINFO)["flags_digest"]
    assert provenance.cpu_info(cpuinfo_text=reordered)["flags_digest"] == digest
    assert provenance.cpu_info(cpuinfo_text=without_avx512)["flags_digest"] != digest


def test_cpu_info_without_cpuinfo_records_none_for_flags() -> None:
    info = provenance.cpu_info(cpuinfo_text="")
    assert info["flags_digest"] is None
    assert info["logical_cores"] == os.cpu_count()


def _git(cwd: Path, *args: str) -> str:
    completed = subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@example.invalid", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        check=True,
    )
    return completed.stdout.strip()


def test_git_commit_reports_head_and_dirtiness(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("REPRO_GIT_COMMIT", raising=False)
    package = tmp_path / "worker"
    package.mkdir()
    (package / "train.py").write_text("x = 1\n")
    _git(tmp_path, "init", "-q")
    _git(tmp_path, "add", ".")
    _git(tmp_path, "commit", "-q", "-m", "init")
    head = _git(tmp_path, "rev-parse", "HEAD")
    assert provenance.git_commit(directory=package) == (head, False)
    (package / "train.py").write_text("x = 2\n")
    assert provenance.git_commit(directory=package) == (head, True)


def test_git_commit_outside_a_repository_is_unknown(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("REPRO_GIT_COMMIT", raising=False)
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path))
    assert provenance.git_commit(directory=tmp_path) == (None, None)


def test_git_commit_prefers_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("REPRO_GIT_COMMIT", "deadbeef")
    monkeypatch.setenv("REPRO_GIT_DIRTY", "false")
    assert provenance.git_commit() == ("deadbeef", False)


def test_importing_the_modules_does_not_import_tensorflow() -> None:
    code = (
        "import sys, worker.record.provenance, worker.record.gpu_info; "
        "sys.exit(1 if 'tensorflow' in sys.modules else 0)"
    )
    root = Path(provenance.__file__).resolve().parent.parent
    env = {**os.environ, "PYTHONPATH": str(root)}
    assert subprocess.run([sys.executable, "-c", code], env=env, check=False).returncode == 0


def test_capture_provenance_has_every_section(captured: dict[str, Any]) -> None:
    assert set(captured) == TOP_LEVEL_KEYS
    assert captured["spec_hash"] == "abc123"
    assert captured["seed"] == [7, 11]
    assert captured["package"]["name"] == "reprotrain"
    assert set(captured["cuda"]) == {"build", "loaded"}
    assert set(captured["cuda"]["loaded"]) == {"driver_version", "runtime_version", "cudnn_version"}
    assert captured["cpu"]["logical_cores"] == os.cpu_count()
    assert captured["python"]["hash_randomization"] == sys.flags.hash_randomization
    assert captured["captured_at"].endswith("+00:00")
    assert captured["probe_errors"] == {}
    # The first GPU's class, or without one the CPU's, as /proc/cpuinfo gives it.
    assert captured["hardware"]["class"].startswith("gpu:" if captured["gpus"] else "cpu:")


def test_capture_provenance_is_json_serialisable(captured: dict[str, Any]) -> None:
    assert json.loads(json.dumps(captured)) == captured


def test_capture_provenance_records_the_running_libraries(captured: dict[str, Any]) -> None:
    assert captured["libraries"]["tensorflow"] == tf.__version__
    assert captured["libraries"]["keras"] == keras.__version__
    assert captured["libraries"]["numpy"] == numpy.__version__
    assert (
        captured["cuda"]["build"]["is_cuda_build"] == tf.sysconfig.get_build_info()["is_cuda_build"]
    )
    assert [gpu["name"] for gpu in captured["tf_gpus"]] == [
        device.name for device in tf.config.list_physical_devices("GPU")
    ]


def test_capture_provenance_threads_match_tensorflow(captured: dict[str, Any]) -> None:
    assert captured["threads"]["intra_op"] == tf.config.threading.get_intra_op_parallelism_threads()
    assert captured["threads"]["inter_op"] == tf.config.threading.get_inter_op_parallelism_threads()
    assert captured["threads"]["omp_num_threads"] == os.environ.get("OMP_NUM_THREADS")


def test_capture_provenance_records_configured_thread_pools() -> None:
    code = (
        "import json, tensorflow as tf\n"
        "from worker.record.provenance import capture_provenance\n"
        "tf.config.threading.set_intra_op_parallelism_threads(3)\n"
        "tf.config.threading.set_inter_op_parallelism_threads(2)\n"
        "record = capture_provenance(spec_hash='h', seed=(1, 2), determinism={})\n"
        "print(json.dumps(record['threads']))\n"
    )
    root = Path(provenance.__file__).resolve().parent.parent
    env = {**os.environ, "PYTHONPATH": str(root), "OMP_NUM_THREADS": "5"}
    completed = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    threads = json.loads(completed.stdout.strip().splitlines()[-1])
    assert threads == {"intra_op": 3, "inter_op": 2, "omp_num_threads": "5"}


def test_capture_provenance_copies_determinism() -> None:
    determinism: dict[str, Any] = {"op_determinism": True, "flags": ["a"]}
    record = provenance.capture_provenance(spec_hash="h", seed=(1, 2), determinism=determinism)
    determinism["flags"].append("b")
    determinism["op_determinism"] = False
    assert record["determinism"] == {"op_determinism": True, "flags": ["a"]}


def test_capture_provenance_filters_secrets(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("REPRO_API_TOKEN", "s3cr3t")
    monkeypatch.setenv("TF_DETERMINISTIC_OPS", "1")
    record = provenance.capture_provenance(spec_hash="h", seed=(1, 2), determinism={})
    assert record["environment"]["TF_DETERMINISTIC_OPS"] == "1"
    assert "s3cr3t" not in json.dumps(record)


def test_capture_provenance_survives_a_failing_probe(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken() -> list[dict[str, Any]]:
        raise RuntimeError("driver exploded")

    monkeypatch.setattr(gpu_info, "gpu_devices", broken)
    record = provenance.capture_provenance(spec_hash="h", seed=(1, 2), determinism={})
    assert record["gpus"] == []
    assert record["probe_errors"]["gpus"] == "RuntimeError: driver exploded"
    assert record["libraries"]["tensorflow"] is not None


def test_capture_provenance_rejects_a_seed_that_is_not_a_pair() -> None:
    with pytest.raises(ValueError, match="pair"):
        provenance.capture_provenance(spec_hash="h", seed=(1, 2, 3), determinism={})  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("raw", "expected"), [(12040, "12.4"), (11080, "11.8"), (12000, "12.0"), (13010, "13.1")]
)
def test_format_driver_version(raw: int, expected: str) -> None:
    assert gpu_info.format_driver_version(raw) == expected


@pytest.mark.parametrize(
    ("raw", "expected"),
    [(90100, "9.1.0"), (90300, "9.3.0"), (91002, "9.10.2"), (8902, "8.9.2"), (7605, "7.6.5")],
)
def test_format_cudnn_version_handles_both_encodings(raw: int, expected: str) -> None:
    assert gpu_info.format_cudnn_version(raw) == expected


def test_format_uuid_matches_nvidia_smi_layout() -> None:
    assert gpu_info.format_uuid(bytes(range(16))) == "GPU-00010203-0405-0607-0809-0a0b0c0d0e0f"
    with pytest.raises(ValueError, match="16 bytes"):
        gpu_info.format_uuid(b"short")


def test_find_loaded_library_reads_proc_maps_lines() -> None:
    maps = (
        "7f00-7f01 r-xp 00000000 08:01 1 /usr/lib/libcudnn_ops.so.9.1.0\n"
        "7f01-7f02 r-xp 00000000 08:01 2 /usr/lib/libcudnn.so.9.1.0\n"
        "7f02-7f03 rw-p 00000000 00:00 0 \n"
    )
    assert gpu_info.find_loaded_library(maps, "libcudnn") == "/usr/lib/libcudnn.so.9.1.0"
    assert gpu_info.find_loaded_library(maps, "libcudart") is None


def test_without_a_driver_there_are_no_devices(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gpu_info, "LIBCUDA_NAME", "libcuda-not-installed.so.1")
    assert gpu_info.gpu_devices() == []
    assert gpu_info.cuda_driver_version() is None
    assert gpu_info.loaded_library_versions()["driver_version"] is None


@pytest.mark.skipif(_driver_loadable(), reason="this machine has a CUDA driver")
def test_machine_without_driver_reports_no_gpus(captured: dict[str, Any]) -> None:
    assert gpu_info.gpu_devices() == []
    assert captured["gpus"] == []
    assert captured["cuda"]["loaded"]["driver_version"] is None


def test_open_if_loaded_never_loads_a_library(tmp_path: Path) -> None:
    loaded = Path(_ctypes.__file__)
    unloaded = tmp_path / "libcopy.so"
    shutil.copyfile(loaded, unloaded)
    assert gpu_info.open_if_loaded(str(loaded)) is not None
    assert gpu_info.open_if_loaded(str(unloaded)) is None
    assert str(unloaded) not in Path("/proc/self/maps").read_text()
