"""`repro doctor` on machines other than this one: the command, its output and its exit code,
with the checks fed another machine's facts (TensorFlow's build info, the driver's GPUs, the
loaded libraries' version integers, the image's build info and /proc/cpuinfo)."""

from __future__ import annotations

import json
from functools import partial
from pathlib import Path
from typing import Any

import typer
from typer.testing import CliRunner

from service.cli import doctor
from service.cli.output import Group
from worker.record import readiness

# tf.sysconfig.get_build_info() of the tensorflow[and-cuda] 2.21 wheel and of tensorflow-cpu.
GPU_BUILD = {
    "cpu_compiler": "/usr/lib/llvm-18/bin/clang",
    "cuda_compute_capabilities": ["sm_60", "sm_70", "sm_80", "sm_89", "compute_90"],
    "cuda_version": "12.5.1",
    "cudnn_version": "9",
    "is_cuda_build": True,
    "is_rocm_build": False,
    "is_tensorrt_build": False,
}
CPU_BUILD = {"is_cuda_build": False, "is_rocm_build": False, "is_tensorrt_build": False}
H100 = {
    "index": 0,
    "name": "NVIDIA H100 80GB HBM3",
    "compute_capability": "9.0",
    "sm_count": 132,
    "memory_bytes": 85029158912,
    "driver_version": "12.8",
    "uuid": "GPU-5d1e2b6a-3f0c-7a4e-9b1d-2c8f6e0a4b71",
}
CPUINFO = """\
processor	: 0
vendor_id	: AuthenticAMD
cpu family	: 25
model		: 1
model name	: AMD EPYC 7763 64-Core Processor
flags		: fpu vme de pse tsc msr pae sse sse2 ssse3 fma sse4_1 sse4_2 avx f16c avx2 bmi2
"""
# Op determinism on and every thread pool pinned, as worker.run starts a job.
JOB_ENVIRONMENT = {
    "TF_DETERMINISTIC_OPS": "1",
    "OMP_NUM_THREADS": "1",
    "TF_NUM_INTRAOP_THREADS": "1",
    "TF_NUM_INTEROP_THREADS": "1",
}


def _tensorflow(build: dict[str, Any], gpu_count: int) -> dict[str, Any]:
    return {
        "version": "2.21.0",
        "build_info": build,
        "gpu_count": gpu_count,
        "tf32": True,
        "intra_op": 1,
        "inter_op": 1,
        "onednn": True,
    }


def _build_info(tmp_path: Path, *, cudnn: str) -> Path:
    """An image's /etc/reprotrain/build-info.json as docker/build_info.py writes it."""
    path = tmp_path / "build-info.json"
    info = {
        "lock": "gpu.txt",
        "lock_digest": "sha256:" + "ab" * 32,
        "tensorflow": "2.21.0",
        "cuda": "12.5.82",
        "cudnn": cudnn,
        "nccl": "2.23.4",
        "python": "3.11.13",
    }
    path.write_text(json.dumps(info))
    return path


def _doctor(**facts: Any) -> typer.Typer:
    """The `repro` application with only `doctor`, whose checks are fed `facts`."""
    app = typer.Typer(cls=Group)

    @app.callback()
    def repro() -> None:
        """Reproducible training."""

    doctor.register(app, check_here=partial(readiness.check, **facts))
    return app


def _gpu_box(tmp_path: Path, *, loaded_cudnn: int, locked_cudnn: str) -> typer.Typer:
    return _doctor(
        environ={**JOB_ENVIRONMENT, "NVIDIA_TF32_OVERRIDE": "0", "CUDA_VISIBLE_DEVICES": "0"},
        tensorflow=_tensorflow(GPU_BUILD, gpu_count=1),
        gpus=[H100],
        loaded={"driver_version": 12080, "runtime_version": 12050, "cudnn_version": loaded_cudnn},
        build_info=_build_info(tmp_path, cudnn=locked_cudnn),
        cpuinfo_text=CPUINFO,
    )


def test_a_box_whose_loaded_cudnn_is_not_the_locked_one_exits_1_naming_both(
    tmp_path: Path,
) -> None:
    # cudnnGetVersion() 91002 is cuDNN 9.10.2: the same major as the lock's 9.1.0.
    app = _gpu_box(tmp_path, loaded_cudnn=91002, locked_cudnn="9.1.0")
    result = CliRunner().invoke(app, ["doctor"])
    assert result.exit_code == 1, result.output
    assert "FLAG cuda: cuDNN 9.10.2 is loaded, the image's lock pins 9.1.0" in result.output
    assert (
        "CUDA built 12.5.1, loaded 12.5, locked 12.5.82; cuDNN built 9, loaded 9.10.2, locked 9.1.0"
    ) in result.output
    assert "CUDA_VISIBLE_DEVICES=0" in result.output

    as_json = CliRunner().invoke(app, ["doctor", "--json"])
    assert as_json.exit_code == 1
    report = json.loads(as_json.output)
    assert report["flags"] == [
        {"check": "cuda", "message": "cuDNN 9.10.2 is loaded, the image's lock pins 9.1.0"}
    ]
    assert report["cuda"]["loaded"] == {
        "driver_version": "12.8",
        "runtime_version": "12.5",
        "cudnn_version": "9.10.2",
    }
    assert report["cuda"]["lock"]["cudnn"] == "9.1.0"


def test_a_box_with_the_locked_cudnn_exits_0(tmp_path: Path) -> None:
    # The wheel nvidia-cudnn-cu12 9.3.0.75 reports 90300.
    app = _gpu_box(tmp_path, loaded_cudnn=90300, locked_cudnn="9.3.0.75")
    result = CliRunner().invoke(app, ["doctor"])
    assert result.exit_code == 0, result.output
    assert "nothing flagged" in result.output
    assert "GPU 0: NVIDIA H100 80GB HBM3, compute capability 9.0, 132 SMs" in result.output
    assert "hardware class: gpu:nvidia-h100-80gb-hbm3:sm132:79gb:full:drv" in result.output


def test_a_plain_cpu_box_exits_0_with_the_thread_note_and_its_fix(tmp_path: Path) -> None:
    app = _doctor(
        environ={"PATH": "/usr/bin", "HOME": "/home/user"},
        tensorflow=_tensorflow(CPU_BUILD, gpu_count=0),
        gpus=[],
        loaded={"driver_version": None, "runtime_version": None, "cudnn_version": None},
        build_info=tmp_path / "no-build-info.json",
        cpuinfo_text=CPUINFO,
    )
    result = CliRunner().invoke(app, ["doctor"])
    assert result.exit_code == 0, result.output
    assert "nothing flagged" in result.output and "\nFLAG " not in result.output
    assert "CPU: AMD EPYC 7763 64-Core Processor (AuthenticAMD), ISA avx2" in result.output
    assert "hardware class: cpu:authenticamd:amd-epyc-7763-64-core-processor:avx2" in result.output
    assert "NOTE threads: thread counts left to the machine" in result.output
    assert "intra_op_threads: 1, inter_op_threads: 1" in result.output
    assert (
        "export OMP_NUM_THREADS=1, TF_NUM_INTRAOP_THREADS=1, TF_NUM_INTEROP_THREADS=1"
        in result.output
    )
