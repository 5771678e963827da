"""Record of the environment a training job ran in, so two runs can be diffed field by field."""

from __future__ import annotations

import hashlib
import importlib
import importlib.metadata
import json
import os
import platform
import re
import subprocess
import sys
from collections.abc import Callable, Iterable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

from worker.record import environment_capture, gpu_info, hardware

_T = TypeVar("_T")

_CONTAINER_MARKERS = ("docker", "containerd", "kubepods")
_GIT_TIMEOUT_S = 10.0
_PACKAGE_DIR = Path(__file__).resolve().parent
# Written while an image is built (docker/build_info.py): what the image pins, and the commit.
BUILD_INFO = Path("/etc/reprotrain/build-info.json")
_COMMIT = re.compile(r"[0-9a-f]{40}|[0-9a-f]{64}")
_PAIR = 2
_CPU_KEYS = ("model", "logical_cores", "affinity_cores", "machine", "flags_digest")


def _digest(lines: Iterable[str]) -> str:
    return "sha256:" + hashlib.sha256("\n".join(lines).encode("utf-8")).hexdigest()


def _normalise_name(name: str) -> str:
    # PEP 503: installers disagree on "typing_extensions" vs "typing-extensions" for one package.
    return re.sub(r"[-_.]+", "-", name).lower()


def _name_and_version(dist: importlib.metadata.Distribution) -> tuple[str | None, str]:
    """A distribution's Name and Version, read from its metadata's header lines: parsing every
    metadata file whole as an email was most of a job's provenance (0.3-0.6 s for 120)."""
    text = dist.read_text("METADATA") or dist.read_text("PKG-INFO") or ""
    found: dict[str, str] = {}
    last = ""
    for line in text.splitlines():
        if not line:
            break  # the headers end at the first empty line
        if line[0] in " \t":
            if last in ("Name", "Version"):
                found.clear()  # a folded value: left to the full parser
                break
            continue
        last, sep, value = line.partition(":")
        if sep and last in ("Name", "Version") and last not in found:
            found[last] = value.lstrip(" \t")  # as the email parser reads a header's value
    if "Name" in found and "Version" in found:
        return found["Name"], found["Version"]
    return dist.metadata["Name"], dist.version


def package_set_digest(*, packages: Iterable[tuple[str, str]] | None = None) -> dict[str, Any]:
    """Count and digest of the installed distributions (or of the given (name, version) pairs)."""
    if packages is None:
        packages = (
            (name, version)
            for name, version in map(_name_and_version, importlib.metadata.distributions())
            if name
        )
    entries = sorted({f"{_normalise_name(name)}=={version}".lower() for name, version in packages})
    return {"count": len(entries), "digest": _digest(entries)}


def relevant_environment(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """Values of the variables known to change numerics (never a secret's), sorted by name."""
    values, _ = environment_capture.capture_environment(environ, key=b"values only")
    return values


def _environment(errors: dict[str, str]) -> tuple[dict[str, str], dict[str, Any]]:
    no_digests: dict[str, Any] = {"key_id": None, "key_source": None, "variables": {}}
    captured = _probe(errors, "environment", environment_capture.capture_environment, None)
    return ({}, no_digests) if captured is None else captured


def _read_text(path: str) -> str | None:
    try:
        return Path(path).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None


def cpu_info(*, cpuinfo_text: str | None = None) -> dict[str, Any]:
    """CPU model, core counts and a digest of the ISA flags (they select oneDNN kernels)."""
    text = _read_text("/proc/cpuinfo") if cpuinfo_text is None else cpuinfo_text
    model: str | None = None
    flags: list[str] | None = None
    for line in (text or "").splitlines():
        key, sep, value = line.partition(":")
        if not sep:
            continue
        key = key.strip()
        if model is None and key == "model name":
            model = value.strip()
        # x86 calls them "flags", ARM "Features".
        elif flags is None and key in ("flags", "Features"):
            flags = value.split()
    affinity: int | None = None
    if hasattr(os, "sched_getaffinity"):
        affinity = len(os.sched_getaffinity(0))
    return {
        "model": model or platform.processor() or None,
        "logical_cores": os.cpu_count(),
        "affinity_cores": affinity,
        "machine": platform.machine() or None,
        "flags_digest": _digest(sorted(set(flags))) if flags else None,
    }


def _git(directory: Path, *args: str) -> str | None:
    try:
        completed = subprocess.run(
            ["git", *args],
            cwd=directory,
            capture_output=True,
            text=True,
            timeout=_GIT_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return completed.stdout.strip() if completed.returncode == 0 else None


def _parse_bool(value: str) -> bool | None:
    lowered = value.strip().lower()
    if lowered in ("1", "true", "yes"):
        return True
    if lowered in ("0", "false", "no"):
        return False
    return None


def build_info_commit(path: Path = BUILD_INFO) -> tuple[str | None, bool | None]:
    """Commit and dirtiness of the source an image was built from, as its build info records
    them; nothing unless that build info describes the installed package's version."""
    try:
        info = json.loads(path.read_text())
    except (OSError, ValueError):
        return None, None
    if not isinstance(info, dict):
        return None, None
    if info.get("reprotrain") != _distribution_version("reprotrain"):
        return None, None  # another installation's, or an image's from before an upgrade
    revision = info.get("revision")
    if not isinstance(revision, str) or not _COMMIT.fullmatch(revision):
        return None, None  # "unknown": built outside a git checkout
    dirty = info.get("revision_dirty")
    return revision, dirty if isinstance(dirty, bool) else None


def git_commit(*, directory: Path | None = None) -> tuple[str | None, bool | None]:
    """Commit and dirtiness of the source tree of the worker package (or of directory); in an
    image, of the tree the image was built from."""
    override = os.environ.get("REPRO_GIT_COMMIT")
    if override:
        dirty_flag = os.environ.get("REPRO_GIT_DIRTY")
        return override, _parse_bool(dirty_flag) if dirty_flag is not None else None
    where = _PACKAGE_DIR if directory is None else directory
    # An installed copy can sit in site-packages inside some unrelated repository (a dotfiles
    # home, a project-local venv): only trust a repository that actually tracks this code.
    if not _git(where, "ls-files", "--", "."):
        # An image has no repository: its build info names the commit it was built from.
        return build_info_commit() if directory is None else (None, None)
    commit = _git(where, "rev-parse", "HEAD")
    if commit is None:
        return None, None
    status = _git(where, "status", "--porcelain")
    return commit, (bool(status) if status is not None else None)


def _in_container() -> bool:
    if Path("/.dockerenv").exists() or Path("/run/.containerenv").exists():
        return True
    cgroup = _read_text("/proc/1/cgroup") or ""
    return any(marker in cgroup for marker in _CONTAINER_MARKERS)


def _json_safe(value: Any) -> Any:
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, Mapping):
        return {str(key): _json_safe(item) for key, item in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        items = sorted(value, key=str) if isinstance(value, set | frozenset) else value
        return [_json_safe(item) for item in items]
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    return str(value)


def flatten_provenance(p: Mapping[str, Any]) -> dict[str, Any]:
    """Nested provenance as {"libraries.tensorflow": ..., "gpus.0.name": ...} for diffing."""
    flat: dict[str, Any] = {}

    def walk(prefix: str, value: Any) -> None:
        if isinstance(value, Mapping) and value:
            for key, item in value.items():
                walk(f"{prefix}.{key}" if prefix else str(key), item)
        elif isinstance(value, list | tuple) and value:
            for index, item in enumerate(value):
                walk(f"{prefix}.{index}" if prefix else str(index), item)
        else:
            # Empty containers stay as leaves so "no GPUs" still differs from "one GPU".
            flat[prefix] = value

    for key, value in p.items():
        walk(str(key), value)
    return flat


def _probe(errors: dict[str, str], name: str, probe: Callable[[], _T], default: _T) -> _T:
    try:
        return probe()
    # A failing probe must never fail the job: record it and carry on.
    except Exception as exc:
        errors[name] = f"{type(exc).__name__}: {exc}"
        return default


def _distribution_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def _module_version(name: str) -> str | None:
    return str(importlib.import_module(name).__version__)


def _tf_gpus(tf: Any) -> list[dict[str, Any]]:
    devices: list[dict[str, Any]] = []
    for device in tf.config.list_physical_devices("GPU"):
        details = dict(tf.config.experimental.get_device_details(device))
        capability = details.get("compute_capability")
        if isinstance(capability, tuple | list) and len(capability) == _PAIR:
            details["compute_capability"] = f"{capability[0]}.{capability[1]}"
        devices.append({"name": device.name, "details": _json_safe(details)})
    return devices


def _tensorflow_sections(errors: dict[str, str]) -> dict[str, Any]:
    # Imported here, not at module level: the API process imports worker/ without TensorFlow.
    tf: Any = _probe(errors, "tensorflow", lambda: importlib.import_module("tensorflow"), None)
    if tf is None:
        return {
            "tensorflow": None,
            "build": None,
            "tf_gpus": [],
            "threads": {"intra_op": None, "inter_op": None},
        }
    threading = tf.config.threading
    return {
        "tensorflow": str(tf.__version__),
        "build": _probe(
            errors, "cuda.build", lambda: _json_safe(dict(tf.sysconfig.get_build_info())), None
        ),
        "tf_gpus": _probe(errors, "tf_gpus", lambda: _tf_gpus(tf), list[dict[str, Any]]()),
        "threads": {
            "intra_op": _probe(
                errors, "threads.intra_op", threading.get_intra_op_parallelism_threads, None
            ),
            "inter_op": _probe(
                errors, "threads.inter_op", threading.get_inter_op_parallelism_threads, None
            ),
        },
    }


def capture_provenance(
    *, spec_hash: str, seed: tuple[int, int], determinism: Mapping[str, Any]
) -> dict[str, Any]:
    """Everything recorded about the environment of one job (JSON-serialisable)."""
    if len(seed) != _PAIR:
        raise ValueError(f"seed must be a pair of ints, got {seed!r}")
    errors: dict[str, str] = {}
    tf_facts = _tensorflow_sections(errors)
    unknown_commit: tuple[str | None, bool | None] = (None, None)
    commit, dirty = _probe(errors, "package.git", git_commit, unknown_commit)
    no_gpus: list[dict[str, Any]] = []
    no_loaded: dict[str, str | None] = dict.fromkeys(
        ("driver_version", "runtime_version", "cudnn_version")
    )
    no_packages: dict[str, Any] = {"count": None, "digest": None}
    libc_name, libc_version = _probe(errors, "os.libc", platform.libc_ver, ("", ""))
    environment, environment_digests = _environment(errors)
    return {
        "spec_hash": spec_hash,
        "seed": [int(seed[0]), int(seed[1])],
        "package": {
            "name": "reprotrain",
            "version": _probe(
                errors, "package.version", lambda: _distribution_version("reprotrain"), None
            ),
            "git_commit": commit,
            "git_dirty": dirty,
        },
        # Set by whoever started the job in an image: the docker executor, or the operator
        # of a pod whose image is pinned by digest.
        "image": {
            "reference": os.environ.get("REPRO_IMAGE_REF") or None,
            "digest": os.environ.get("REPRO_IMAGE_DIGEST") or None,
            "id": os.environ.get("REPRO_IMAGE_ID") or None,
            "repo_digests": [
                d for d in os.environ.get("REPRO_IMAGE_REPO_DIGESTS", "").split(",") if d
            ],
            "in_container": _probe(errors, "image.in_container", _in_container, None),
        },
        "python": {
            "version": platform.python_version(),
            "implementation": platform.python_implementation(),
            "compiler": platform.python_compiler(),
            "hash_randomization": sys.flags.hash_randomization,
        },
        "libraries": {
            "tensorflow": tf_facts["tensorflow"],
            "keras": _probe(errors, "libraries.keras", lambda: _module_version("keras"), None),
            "numpy": _probe(errors, "libraries.numpy", lambda: _module_version("numpy"), None),
            "blake3": _probe(errors, "libraries.blake3", lambda: _module_version("blake3"), None),
        },
        "cuda": {
            "build": tf_facts["build"],
            "loaded": _probe(errors, "cuda.loaded", gpu_info.loaded_library_versions, no_loaded),
        },
        "gpus": (gpus := _probe(errors, "gpus", gpu_info.gpu_devices, no_gpus)),
        "tf_gpus": tf_facts["tf_gpus"],
        "cpu": _probe(errors, "cpu", cpu_info, dict.fromkeys(_CPU_KEYS)),
        # What reruns are pinned to by default (worker.record.hardware).
        "hardware": {
            "class": _probe(errors, "hardware", lambda: hardware.this_machine(gpus)["class"], None)
        },
        "os": {
            "system": platform.system() or None,
            "release": platform.release() or None,
            "libc": f"{libc_name} {libc_version}".strip() or None,
        },
        "threads": {
            **tf_facts["threads"],
            "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
        },
        "determinism": _json_safe(determinism),
        # Values of the variables known to change numerics; every other variable by name
        # with a keyed digest of its value (see worker/record/environment_capture.py).
        "environment": environment,
        "environment_digests": environment_digests,
        "packages": _probe(errors, "packages", package_set_digest, no_packages),
        "captured_at": datetime.now(UTC).isoformat(),
        "probe_errors": errors,
    }


# Fields whose change can alter the bits a training run produces, with why (first match
# wins; a prefix ending in "." covers the whole section).
_BREAKING: tuple[tuple[str, str], ...] = (
    ("image.id", "another container image: every library in it may differ"),
    ("image.digest", "another container image: every library in it may differ"),
    ("image.repo_digests.", "another container image: every library in it may differ"),
    ("image.reference", "another container image: every library in it may differ"),
    ("package.", "another version of the training code"),
    ("libraries.", "another library version: kernels and defaults change between releases"),
    ("cuda.", "another CUDA/cuDNN build or runtime: GPU kernels and their algorithms differ"),
    ("gpus.", "another GPU, SM count or driver: kernel choice and reduction order differ"),
    ("tf_gpus.", "another GPU as TensorFlow sees it: kernel choice differs"),
    (
        "hardware.class",
        "another hardware class (GPU product, SM count, MIG slice or driver; CPU model or ISA "
        "level): other kernels and reduction orders",
    ),
    ("cpu.flags_digest", "other CPU instruction sets: oneDNN/Eigen pick other kernels"),
    ("cpu.model", "another CPU model: vector kernels and their reduction order may differ"),
    ("threads.", "other thread counts: parallel reductions sum in another order"),
    (
        "determinism.tf32",
        "TF32 on one side: float32 matmuls and convolutions round their inputs to 10 mantissa "
        "bits on Ampere and newer GPUs",
    ),
    ("determinism.", "other determinism settings"),
    ("packages.", "another set of installed packages"),
    ("os.libc", "another C library: libm's transcendental functions may round differently"),
    ("python.version", "another Python: its packages are other builds"),
)
_IGNORED = ("captured_at",)
# Told variable by variable by environment_capture.diff_environment, which never shows a value
# recorded only as a digest and knows which variables can change numerics.
_ENVIRONMENT_SECTIONS = ("environment", "environment_digests")


# Fields whose change is worth telling though it changes no bits by itself.
_NOTED: tuple[tuple[str, str], ...] = (
    (
        "execution.",
        "one run was run by hand on its user's machine, in no worker's pinned environment",
    ),
    (
        "placement.hardware_override",
        "the rerun was sent to other hardware than its run's, on request (an override)",
    ),
)


def _classify(field: str) -> tuple[bool, str | None]:
    for prefix, why in _BREAKING:
        if field == prefix or (prefix.endswith(".") and field.startswith(prefix)):
            return True, why
    for prefix, why in _NOTED:
        if field.startswith(prefix):
            return False, why
    return False, None


def diff_provenance(a: Mapping[str, Any], b: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Every recorded environment field that differs, fields that break bitwise results first.

    Each entry is `{"field", "a", "b", "breaks_reproducibility", "why"}` with dotted field
    names (`libraries.tensorflow`, `environment.TF_NUM_INTEROP_THREADS`); a field missing on
    one side has None there. An environment variable recorded only as a keyed digest shows
    as `hidden:<digest prefix>`, never by value. The capture time is not compared.
    """
    rest_a = {k: v for k, v in a.items() if k not in _ENVIRONMENT_SECTIONS}
    rest_b = {k: v for k, v in b.items() if k not in _ENVIRONMENT_SECTIONS}
    flat_a, flat_b = flatten_provenance(rest_a), flatten_provenance(rest_b)
    fields = set(flat_a) | set(flat_b)
    # An empty section on one side ({"gpus": []}) is already told by its fields.
    covered = {
        f
        for f in fields
        if (flat_a.get(f) in ({}, []) or flat_b.get(f) in ({}, []))
        and any(other.startswith(f + ".") for other in fields)
    }
    entries = environment_capture.diff_environment(a, b)
    for field in sorted(fields - covered):
        if field in _IGNORED or flat_a.get(field) == flat_b.get(field):
            continue
        breaking, why = _classify(field)
        entries.append(
            {
                "field": field,
                "a": flat_a.get(field),
                "b": flat_b.get(field),
                "breaks_reproducibility": breaking,
                "why": why,
            }
        )
    return sorted(entries, key=lambda e: (not e["breaks_reproducibility"], e["field"]))
