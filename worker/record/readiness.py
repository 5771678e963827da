"""Whether this machine (or image) can reproduce a run: what a job would record on it and the
settings that threaten bitwise reproducibility (`repro doctor`, and the worker at start).

`python -m worker.record.readiness --json` prints the report and exits 1 when something is flagged,
so the same checks run here, in a worker image (`repro doctor --image`) and under an agent.
TensorFlow is imported inside `check` only: the CLI and the agent import this module freely.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import sys
import tempfile
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from worker.record import gpu_info, hardware
from worker.record.library_versions import (
    LIBRARIES,
    agree,
    dotted,
    loaded_versions,
    parse_cuda_version,
    parse_cudnn_version,
    parse_xla_flags,
)
from worker.record.provenance import BUILD_INFO

_THREAD_VARIABLES = ("OMP_NUM_THREADS", "TF_NUM_INTRAOP_THREADS", "TF_NUM_INTEROP_THREADS")
# The variables a report shows by value: each changes which kernels run, how, or on which devices.
_SHOWN = re.compile(
    r"(?:TF_CUDNN_|NCCL_|TF_GPU_|TF_ENABLE_|XLA_FLAGS$|TF_XLA_FLAGS$|CUBLAS_WORKSPACE_CONFIG$"
    r"|CUDA_VISIBLE_DEVICES$|ONEDNN_MAX_CPU_ISA$)"
)
# Shown on lines of their own in the summary, set or not.
_SUMMARISED = (
    "XLA_FLAGS",
    "TF_XLA_FLAGS",
    "CUDA_VISIBLE_DEVICES",
    "TF_ENABLE_ONEDNN_OPTS",
    "ONEDNN_MAX_CPU_ISA",
)
_TF32_CAPABILITY = 8.0  # Ampere and newer
_OFF = ("0", "false", "no", "off", "")
# How replicas' gradients are summed (worker/training/replicas.py): never NCCL.
REPLICA_REDUCTION = "ReductionToOneDevice (add_n on one device; NCCL is not used)"

_PRECISION = ("", "major version", "major.minor version", "major.minor.patch version")
# "I0000 00:00:1796489805.889274    1283 " before a TensorFlow (absl) log message.
_LOG_PREFIX = re.compile(r"^[IWEF]\d{4} [\d:.]+\s+\d+ ")


def _capability(device: Mapping[str, Any]) -> float | None:
    try:
        return float(str(device.get("compute_capability")))
    except ValueError:
        return None


def parse_cpuinfo(text: str, isa_cap: str | None = None) -> dict[str, Any]:
    """Vendor, model name, the widest oneDNN ISA the flags allow (capped by
    `ONEDNN_MAX_CPU_ISA`: it picks oneDNN's kernels) and AMX flags, from /proc/cpuinfo text."""
    facts = hardware.cpu_facts(text)
    flags = facts["flags"]
    return {
        "vendor": facts["vendor"],
        "model": facts["model"],
        "isa": hardware.isa_level(flags, isa_cap) if flags else None,
        "amx": sorted(flag for flag in flags if flag.startswith("amx")),
    }


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


def unique_log_lines(text: str) -> list[str]:
    """Captured stderr lines with each message kept once, whatever its timestamp: some of
    TensorFlow's extension modules (_pywrap_profiler_plugin.so) carry their own copy of its
    start-up code and logging, so one import prints the oneDNN banner once per copy."""
    seen: set[str] = set()
    kept = []
    for line in text.splitlines(keepends=True):
        message = _LOG_PREFIX.sub("", line).strip()
        if message and message in seen:
            continue
        seen.add(message)
        kept.append(line)
    return kept


@contextlib.contextmanager
def _stderr_once() -> Iterator[None]:
    """Send what the block writes to file descriptor 2 (where TensorFlow's C++ logs go) to a
    temporary file, then write it to stderr with each message once."""
    sys.stderr.flush()
    try:
        saved = os.dup(2)
    except OSError:  # no stderr to tidy
        yield
        return
    with tempfile.TemporaryFile() as captured:
        os.dup2(captured.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            captured.seek(0)
            sys.stderr.write("".join(unique_log_lines(captured.read().decode("utf-8", "replace"))))
            sys.stderr.flush()


def tensorflow_facts() -> dict[str, Any]:
    """What TensorFlow says here: its version, `tf.sysconfig.get_build_info()`, how many GPUs it
    sees, TF32, its thread pools and whether oneDNN custom operations are on."""
    # INFO lines (the CPU-feature banner) say nothing the report does not; warnings, such as
    # GPU libraries that would not load, stay. An operator's own level wins.
    quieted = "TF_CPP_MIN_LOG_LEVEL" not in os.environ
    if quieted:
        os.environ["TF_CPP_MIN_LOG_LEVEL"] = "1"
    try:
        import tensorflow as tf
    finally:
        if quieted:
            os.environ.pop("TF_CPP_MIN_LOG_LEVEL", None)
    try:
        from tensorflow.python.util import _pywrap_util_port

        onednn: bool | None = bool(_pywrap_util_port.IsMklEnabled())
    except (ImportError, AttributeError):  # a TensorFlow without the probe: not known
        onednn = None
    return {
        "version": str(tf.__version__),
        "build_info": dict(tf.sysconfig.get_build_info()),
        "gpu_count": len(tf.config.list_physical_devices("GPU")),
        "tf32": bool(tf.config.experimental.tensor_float_32_execution_enabled()),
        "intra_op": tf.config.threading.get_intra_op_parallelism_threads(),
        "inter_op": tf.config.threading.get_inter_op_parallelism_threads(),
        "onednn": onednn,
    }


def check(
    environ: Mapping[str, str] | None = None,
    *,
    tensorflow: Mapping[str, Any] | None = None,
    gpus: list[dict[str, Any]] | None = None,
    loaded: Mapping[str, Any] | None = None,
    build_info: Path = BUILD_INFO,
    cpuinfo_text: str | None = None,
) -> dict[str, Any]:
    """The report: GPUs, CUDA/cuDNN (built, loaded, locked), TF32, op determinism, threads, the
    CPU and oneDNN, XLA flags, the variables that steer kernels, how replicas reduce, and the
    flags and notes raised.

    Each keyword gives one of the machine's facts instead of reading it: TensorFlow's (as
    `tensorflow_facts` returns them), the driver's GPUs, the loaded libraries' versions (dotted
    or the libraries' integers), the image's build-info file and /proc/cpuinfo's text.
    """
    env = dict(os.environ if environ is None else environ)
    errors: dict[str, str] = {}
    tf_facts: dict[str, Any] = {}
    if tensorflow is not None:
        tf_facts = dict(tensorflow)
    else:
        try:
            with _stderr_once():
                tf_facts = tensorflow_facts()
        except Exception as exc:  # a broken install is itself the finding
            errors["tensorflow"] = f"{type(exc).__name__}: {exc}"
    try:
        gpus = gpu_info.gpu_devices() if gpus is None else gpus
        loaded = gpu_info.loaded_library_versions() if loaded is None else loaded
    except Exception as exc:  # a driver that misbehaves: report, do not crash the check
        errors["gpus"] = f"{type(exc).__name__}: {exc}"
        gpus, loaded = [], {}
    build = tf_facts.get("build_info") or {}
    cpuinfo = hardware.read_cpuinfo() if cpuinfo_text is None else cpuinfo_text
    cpu = parse_cpuinfo(cpuinfo, env.get("ONEDNN_MAX_CPU_ISA"))
    machine = hardware.hardware_class(
        gpus,
        cpuinfo_text=cpuinfo,
        driver_text=hardware.read_driver_version() if gpus else None,
        environ=env,
    )
    report: dict[str, Any] = {
        "hardware_class": machine["class"],  # what reruns of a job here are pinned to
        "gpus": gpus,
        "tensorflow": tf_facts.get("version"),
        "tensorflow_gpu_count": tf_facts.get("gpu_count"),
        "cuda": {
            "built": {"cuda": build.get("cuda_version"), "cudnn": build.get("cudnn_version")},
            "loaded": loaded_versions(loaded),
            "lock": _lock(build_info),
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
        "cpu": {**cpu, "ONEDNN_MAX_CPU_ISA": env.get("ONEDNN_MAX_CPU_ISA")},
        "onednn": {
            "enabled": tf_facts.get("onednn"),
            "TF_ENABLE_ONEDNN_OPTS": env.get("TF_ENABLE_ONEDNN_OPTS"),
        },
        "xla": {name: parse_xla_flags(env.get(name)) for name in ("XLA_FLAGS", "TF_XLA_FLAGS")},
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
    found = [{"check": "cuda", "message": m} for m in _version_notes(report.get("cuda") or {})]
    xla = (report.get("xla") or {}).get("XLA_FLAGS") or {}
    if str(xla.get("xla_gpu_deterministic_ops", "")).strip().lower() in ("false", "0"):
        found.append(
            {
                "check": "xla",
                "message": "XLA_FLAGS sets --xla_gpu_deterministic_ops=false: TensorFlow sets it "
                "back to true for what it compiles with XLA while op determinism is on (in every "
                "job whose spec keeps determinism.op_determinism), so jobs are unaffected, but XLA "
                "code run without op determinism may pick GPU kernels by timing and use "
                "nondeterministic ones; remove it from XLA_FLAGS",
            }
        )
    threads = report.get("threads") or {}
    unset = [name for name in _THREAD_VARIABLES if not threads.get(name)]
    if unset:
        found.append(
            {
                "check": "threads",
                "message": f"thread counts left to the machine ({', '.join(unset)} unset): "
                "reruns on this machine type are identical, but a spec without "
                "determinism.intra_op_threads and inter_op_threads reduces in another order on "
                "another CPU count. To compare across machines, set both in the spec (e.g. "
                "determinism: {intra_op_threads: 1, inter_op_threads: 1}); for scripts run "
                "outside a job, export " + ", ".join(f"{n}=1" for n in unset),
            }
        )
    return found


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


def _cuda_mismatches(cuda: Mapping[str, Any], have_gpus: bool) -> list[str]:
    """CUDA and cuDNN versions that disagree between TensorFlow's build, the libraries loaded
    (with a GPU only: nothing loads them without one) and the image's lock, each compared to as
    many numbers as both give (cuDNN to the patch, CUDA to the minor)."""
    built, loaded, lock = cuda.get("built") or {}, cuda.get("loaded") or {}, cuda.get("lock") or {}
    found = []
    for name, parse, key, loaded_key, depth in LIBRARIES:
        was_built, was_loaded, locked = (
            parse(built.get(key)),
            parse(loaded.get(loaded_key)),
            parse(lock.get(key)),
        )
        if have_gpus and was_loaded:
            against = []
            if was_built and not agree(was_loaded, was_built, depth):
                against.append(f"TensorFlow was built for {dotted(was_built)}")
            if locked and not agree(was_loaded, locked, depth):
                against.append(f"the image's lock pins {dotted(locked)}")
            if against:
                found.append(f"{name} {dotted(was_loaded)} is loaded, {' and '.join(against)}")
        if was_built and locked and not agree(was_built, locked, depth):
            found.append(
                f"the image's lock pins {name} {dotted(locked)}, TensorFlow was built for "
                f"{dotted(was_built)}"
            )
    return found


def _version_notes(cuda: Mapping[str, Any]) -> list[str]:
    """Versions that could not be read, and lock pins too short to compare to the patch."""
    built, loaded, lock = cuda.get("built") or {}, cuda.get("loaded") or {}, cuda.get("lock") or {}
    found = []
    for name, parse, key, loaded_key, depth in LIBRARIES:
        sources = (
            ("TensorFlow's build", built.get(key)),
            ("the loaded library", loaded.get(loaded_key)),
            ("the image's lock", lock.get(key)),
        )
        for source, value in sources:
            if value not in (None, "") and parse(value) is None:
                found.append(f"{name} version {value!r} of {source} is unreadable: not compared")
        locked = parse(lock.get(key))
        if locked and len(locked) < depth:
            given = _PRECISION[len(locked)]
            found.append(
                f"the image's lock pins only the {given} of {name} ({dotted(locked)}), so the "
                f"loaded and built {name} were compared to the {given} only; pin the full version "
                f"in the lock to compare to the {_PRECISION[depth]}"
            )
    return found


def _shown_version(value: Any, parse: Callable[[object], tuple[int, ...] | None]) -> str:
    if value in (None, ""):
        return "-"
    parsed = parse(value)
    return str(value) if parsed is None or isinstance(value, str) else dotted(parsed)


def _cpu_line(cpu: Mapping[str, Any], isa_cap: str) -> str:
    amx = cpu.get("amx") or []
    return (
        f"CPU: {cpu.get('model') or 'model unknown'} ({cpu.get('vendor') or 'vendor unknown'}), "
        f"ISA {cpu.get('isa') or 'below SSE4.2 or not x86'}"
        + (f" with AMX ({', '.join(amx)})" if amx else "")
        + f"; ONEDNN_MAX_CPU_ISA={isa_cap}"
    )


def summary_lines(report: Mapping[str, Any]) -> list[str]:
    """The report for people: what a job would record, then each flag."""
    cuda = report.get("cuda") or {}
    built, loaded, lock = cuda.get("built") or {}, cuda.get("loaded") or {}, cuda.get("lock") or {}
    environment = report.get("environment") or {}
    # Set but empty is not unset: CUDA_VISIBLE_DEVICES="" hides every GPU.
    shown = {
        name: "(unset)" if environment.get(name) is None else environment[name] or '""'
        for name in _SUMMARISED
    }
    lines = [f"TensorFlow {report.get('tensorflow') or 'not importable'}"]
    if report.get("hardware_class"):
        lines.append(f"hardware class: {report['hardware_class']} (what reruns are pinned to)")
    if report.get("cpu"):
        lines.append(_cpu_line(report["cpu"], shown["ONEDNN_MAX_CPU_ISA"]))
    onednn = (report.get("onednn") or {}).get("enabled")
    lines.append(
        f"oneDNN custom operations {'unknown' if onednn is None else 'on' if onednn else 'off'}; "
        f"TF_ENABLE_ONEDNN_OPTS={shown['TF_ENABLE_ONEDNN_OPTS']}"
    )
    for gpu in report.get("gpus") or []:
        lines.append(
            f"GPU {gpu.get('index')}: {gpu.get('name')}, compute capability "
            f"{gpu.get('compute_capability')}, {gpu.get('sm_count')} SMs, driver "
            f"{gpu.get('driver_version')}"
        )
    if not report.get("gpus"):
        lines.append("GPUs: none visible to the driver")
    lines.append(f"CUDA_VISIBLE_DEVICES={shown['CUDA_VISIBLE_DEVICES']}")
    lines.append(
        f"CUDA built {built.get('cuda') or '-'}, loaded "
        f"{_shown_version(loaded.get('runtime_version'), parse_cuda_version)}, locked "
        f"{lock.get('cuda') or '-'}; cuDNN built {built.get('cudnn') or '-'}, loaded "
        f"{_shown_version(loaded.get('cudnn_version'), parse_cudnn_version)}, locked "
        f"{lock.get('cudnn') or '-'}"
    )
    tf32, threads = report.get("tf32") or {}, report.get("threads") or {}
    lines.append(
        f"TF32 {'on' if tf32.get('enabled') else 'off'}"
        f"{'' if tf32.get('applies') else ' (no GPU here that uses it)'}; TF_DETERMINISTIC_OPS="
        f"{(report.get('op_determinism') or {}).get('TF_DETERMINISTIC_OPS') or '(unset)'}"
    )
    lines.append(f"XLA_FLAGS={shown['XLA_FLAGS']}; TF_XLA_FLAGS={shown['TF_XLA_FLAGS']}")
    lines.append(
        "threads: " + ", ".join(f"{k}={threads.get(k) or '(unset)'}" for k in _THREAD_VARIABLES)
    )
    lines += [f"{k}={v}" for k, v in environment.items() if k not in _SUMMARISED]
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
