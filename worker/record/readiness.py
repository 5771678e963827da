"""Whether this machine (or image) can reproduce a run: what a job would record on it and the
settings that threaten bitwise reproducibility (`repro doctor`, and the worker at start).

`python -m worker.record.readiness --json` prints the report and exits 1 when something is flagged,
so the same checks run here, in a worker image (`repro doctor --image`) and under an agent.
TensorFlow is imported inside `check` only: the CLI and the agent import this module freely.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from worker.record import gpu_info
from worker.record.provenance import BUILD_INFO

# The variables a report shows by value: each changes what GPU kernels compute or pick.
_THREAD_VARIABLES = ("OMP_NUM_THREADS", "TF_NUM_INTRAOP_THREADS", "TF_NUM_INTEROP_THREADS")
_SHOWN = re.compile(r"(?:TF_CUDNN_|NCCL_|TF_GPU_|TF_ENABLE_|XLA_FLAGS$|CUBLAS_WORKSPACE_CONFIG$)")
_TF32_CAPABILITY = 8.0  # Ampere and newer
_OFF = ("0", "false", "no", "off", "")
# How replicas' gradients are summed (worker/training/replicas.py): never NCCL.
REPLICA_REDUCTION = "ReductionToOneDevice (add_n on one device; NCCL is not used)"


def _capability(device: Mapping[str, Any]) -> float | None:
    try:
        return float(str(device.get("compute_capability")))
    except ValueError:
        return None


def _lock(path: Path = BUILD_INFO) -> dict[str, Any] | None:
    """What the image's lock pins (its build info), or None outside a built image."""
    try:
        info = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(info, dict):
        return None
    keys = ("lock", "lock_digest", "tensorflow", "cuda", "cudnn", "nccl")
    return {key: info.get(key) for key in keys}


def _tensorflow_facts(errors: dict[str, str]) -> dict[str, Any]:
    try:
        import tensorflow as tf

        build = dict(tf.sysconfig.get_build_info())
        tf_gpus = tf.config.list_physical_devices("GPU")
        return {
            "version": str(tf.__version__),
            "built_cuda": build.get("cuda_version"),
            "built_cudnn": build.get("cudnn_version"),
            "tf_gpu_count": len(tf_gpus),
            "tf32": bool(tf.config.experimental.tensor_float_32_execution_enabled()),
            "intra_op": tf.config.threading.get_intra_op_parallelism_threads(),
            "inter_op": tf.config.threading.get_inter_op_parallelism_threads(),
        }
    except Exception as exc:  # a broken install is itself the finding
        errors["tensorflow"] = f"{type(exc).__name__}: {exc}"
        return {}


def check(environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The report: GPUs, CUDA/cuDNN (built, loaded, locked), TF32, op determinism, threads,
    the variables that steer GPU kernels, how replicas reduce, and the flags raised."""
    env = dict(os.environ if environ is None else environ)
    errors: dict[str, str] = {}
    tf_facts = _tensorflow_facts(errors)
    try:
        gpus = gpu_info.gpu_devices()
        loaded = gpu_info.loaded_library_versions()
    except Exception as exc:  # a driver that misbehaves: report, do not crash the check
        errors["gpus"] = f"{type(exc).__name__}: {exc}"
        gpus, loaded = [], {}
    report: dict[str, Any] = {
        "gpus": gpus,
        "tensorflow": tf_facts.get("version"),
        "tensorflow_gpu_count": tf_facts.get("tf_gpu_count"),
        "cuda": {
            "built": {"cuda": tf_facts.get("built_cuda"), "cudnn": tf_facts.get("built_cudnn")},
            "loaded": loaded,
            "lock": _lock(),
        },
        "tf32": {
            "enabled": tf_facts.get("tf32"),
            "NVIDIA_TF32_OVERRIDE": env.get("NVIDIA_TF32_OVERRIDE"),
            "applies": any((_capability(g) or 0) >= _TF32_CAPABILITY for g in gpus),
        },
        "op_determinism": {"TF_DETERMINISTIC_OPS": env.get("TF_DETERMINISTIC_OPS")},
        "threads": {
            **{name: env.get(name) for name in _THREAD_VARIABLES},
            "intra_op": tf_facts.get("intra_op"),
            "inter_op": tf_facts.get("inter_op"),
        },
        "environment": {k: v for k, v in sorted(env.items()) if _SHOWN.match(k)},
        "replica_reduction": REPLICA_REDUCTION,
        "probe_errors": errors,
    }
    report["flags"] = flags(report)
    report["notes"] = notes(report)
    return report


def notes(report: Mapping[str, Any]) -> list[dict[str, str]]:
    """Advice that is not a threat on this machine: [{"check", "message"}]. Thread counts
    left to the machine are the usual case (every example spec leaves them): a job pins the
    counts its spec names, so a rerun on the same machine type is identical either way."""
    threads = report.get("threads") or {}
    unset = [name for name in _THREAD_VARIABLES if not threads.get(name)]
    if not unset:
        return []
    return [
        {
            "check": "threads",
            "message": f"thread counts left to the machine ({', '.join(unset)} unset): reruns "
            "on this machine type are identical, but a spec without "
            "determinism.intra_op_threads and inter_op_threads reduces in another order on "
            "another CPU count. To compare across machines, set both in the spec (e.g. "
            "determinism: {intra_op_threads: 1, inter_op_threads: 1}); for scripts run "
            "outside a job, export " + ", ".join(f"{n}=1" for n in unset),
        }
    ]


def flags(report: Mapping[str, Any]) -> list[dict[str, str]]:
    """What threatens reproducibility in a report: [{"check", "message"}], [] when nothing."""
    found: list[dict[str, str]] = []

    def flag(name: str, message: str) -> None:
        found.append({"check": name, "message": message})

    gpus = report.get("gpus") or []
    deterministic = (report.get("op_determinism") or {}).get("TF_DETERMINISTIC_OPS")
    if deterministic is not None and deterministic.strip().lower() in _OFF:
        flag(
            "op_determinism",
            f"TF_DETERMINISTIC_OPS={deterministic}: op determinism is off for anything not "
            "started by `python -m worker.run` (which sets it from the spec)",
        )
    tf32 = report.get("tf32") or {}
    if tf32.get("enabled") and tf32.get("applies") and tf32.get("NVIDIA_TF32_OVERRIDE") != "0":
        flag(
            "tf32",
            "TF32 is on (TensorFlow's default) on a GPU of compute capability 8.0 or newer: runs "
            "match only on the same GPU model; set determinism.tf32: false to compare models",
        )
    names = sorted({str(g.get("name")) for g in gpus})
    if len(names) > 1:
        flag("gpus", f"GPUs of different models ({', '.join(names)}): replicas compute apart")
    if gpus and report.get("tensorflow_gpu_count") == 0:
        flag("gpus", f"the driver lists {len(gpus)} GPUs but TensorFlow sees none: jobs use CPU")
    for message in _cuda_mismatches(report.get("cuda") or {}, bool(gpus)):
        flag("cuda", message)
    steering = sorted(k for k in report.get("environment") or {} if k.startswith("TF_CUDNN_"))
    if gpus and steering:
        flag(
            "environment",
            f"{', '.join(steering)} set: they steer which cuDNN algorithms run, so every "
            "machine that reruns must set them alike",
        )
    for name, error in (report.get("probe_errors") or {}).items():
        flag("probe", f"{name} could not be read: {error}")
    return found


def _same_release(a: Any, b: Any) -> bool:
    """Whether two versions agree in major.minor, or in as much as the shorter one gives
    (TensorFlow says cuDNN "9"; the lock pins "9.3.0.75")."""
    pa, pb = re.findall(r"\d+", str(a))[:2], re.findall(r"\d+", str(b))[:2]
    depth = min(len(pa), len(pb))
    return pa[:depth] == pb[:depth]


def _cuda_mismatches(cuda: Mapping[str, Any], have_gpus: bool) -> list[str]:
    """CUDA and cuDNN versions that disagree between TensorFlow's build, the libraries loaded
    (with a GPU only: nothing loads them without one) and the image's lock."""
    built, loaded, lock = cuda.get("built") or {}, cuda.get("loaded") or {}, cuda.get("lock") or {}
    found = []
    pairs = (
        ("CUDA", built.get("cuda"), loaded.get("runtime_version"), lock.get("cuda")),
        ("cuDNN", built.get("cudnn"), loaded.get("cudnn_version"), lock.get("cudnn")),
    )
    for name, was_built, was_loaded, locked in pairs:
        if have_gpus and was_built and was_loaded and not _same_release(was_built, was_loaded):
            found.append(f"{name} {was_loaded} is loaded, TensorFlow was built for {was_built}")
        if was_built and locked and not _same_release(was_built, locked):
            found.append(
                f"the image's lock pins {name} {locked}, TensorFlow was built for {was_built}"
            )
    return found


def summary_lines(report: Mapping[str, Any]) -> list[str]:
    """The report for people: what a job would record, then each flag."""
    cuda = report.get("cuda") or {}
    built, loaded, lock = cuda.get("built") or {}, cuda.get("loaded") or {}, cuda.get("lock") or {}
    lines = [f"TensorFlow {report.get('tensorflow') or 'not importable'}"]
    for gpu in report.get("gpus") or []:
        lines.append(
            f"GPU {gpu.get('index')}: {gpu.get('name')}, compute capability "
            f"{gpu.get('compute_capability')}, {gpu.get('sm_count')} SMs, driver "
            f"{gpu.get('driver_version')}"
        )
    if not report.get("gpus"):
        lines.append("GPUs: none visible to the driver")
    lines.append(
        f"CUDA built {built.get('cuda') or '-'}, loaded {loaded.get('runtime_version') or '-'}"
        f", locked {lock.get('cuda') or '-'}; cuDNN built {built.get('cudnn') or '-'}, loaded "
        f"{loaded.get('cudnn_version') or '-'}, locked {lock.get('cudnn') or '-'}"
    )
    tf32, threads = report.get("tf32") or {}, report.get("threads") or {}
    lines.append(
        f"TF32 {'on' if tf32.get('enabled') else 'off'}"
        f"{'' if tf32.get('applies') else ' (no GPU here that uses it)'}; TF_DETERMINISTIC_OPS="
        f"{(report.get('op_determinism') or {}).get('TF_DETERMINISTIC_OPS') or '(unset)'}"
    )
    lines.append(
        "threads: " + ", ".join(f"{k}={threads.get(k) or '(unset)'}" for k in _THREAD_VARIABLES)
    )
    lines += [f"{k}={v}" for k, v in (report.get("environment") or {}).items()]
    lines.append(f"replicas reduce with {report.get('replica_reduction')}")
    found = report.get("flags") or []
    lines.append("" if found else "nothing flagged")
    lines += [f"FLAG {f['check']}: {f['message']}" for f in found]
    lines += [f"NOTE {n['check']}: {n['message']}" for n in report.get("notes") or []]
    return lines


def main(argv: list[str] | None = None) -> int:
    """Print the report (JSON with --json); exit 1 when something is flagged."""
    parser = argparse.ArgumentParser(prog="python -m worker.record.readiness", description=__doc__)
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    args = parser.parse_args(argv)
    report = check()
    if args.json:
        print(json.dumps(report, sort_keys=True))
    else:
        print("\n".join(summary_lines(report)))
    return 1 if report["flags"] else 0


if __name__ == "__main__":
    sys.exit(main())
