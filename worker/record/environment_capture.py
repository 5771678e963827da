"""Which environment variables a job records, and how, and how two records differ.

Variables known to change numerics (TensorFlow's, CUDA/cuDNN/XLA, oneDNN/OpenMP/MKL/BLAS
threads, PYTHONHASHSEED, plus the operator's) are recorded with their values. Every other
variable is recorded by name with a keyed digest (HMAC-SHA256) of its value, never the
value: a plain hash of a low-entropy value ("1", a short password) is guessed by hashing
candidates, a keyed one is not without the key. The key is the service's, so runs on
different workers compare; a local run uses the key file of its data directory.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import re
import secrets
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

KEY_ENV = "REPRO_PROVENANCE_KEY"  # the key, handed to the job by the node that runs it
KEY_FILE = "provenance.key"  # in the data directory, for runs with no key handed to them
NUMERIC_ENV = "REPRO_NUMERIC_ENV_VARS"  # the operator's additions to the numerics list
# Where a node asks its job to save the final model: a variable rather than an option, so a
# job in an image from before model export (a rerun pinned to it) ignores it and still runs.
EXPORT_MODEL_ENV = "REPRO_EXPORT_MODEL"
DIGEST_PREFIX = "hmac-sha256:"
_SHOWN_HEX = 12

# Read by TensorFlow, Keras, CUDA/cuDNN/cuBLAS/NCCL, XLA, oneDNN and the BLAS/OpenMP
# runtimes, with an effect on which kernels run, in which precision, or in how many
# threads (so in which order floating-point sums are taken). Names from the TensorFlow
# 2.x sources; TF_* outside this list (Terraform's TF_CLI_CONFIG_FILE, TF_VAR_*, TF_LOG,
# TensorFlow's logging and dump switches) are not numerics.
NUMERIC_NAMES = frozenset(
    {
        "TF_DETERMINISTIC_OPS",
        "TF_DETERMINISTIC_ORDER",
        "TF_ENABLE_ONEDNN_OPTS",
        "TF_ENABLE_ONEDNN_SPMM",
        "TF_ENABLE_ZENDNN_OPTS",
        "TF_SET_ONEDNN_FPMATH_MODE",
        "TF_XLA_FLAGS",
        "TF_XLA_BRIDGE",
        "TF_DISABLE_JIT_KERNELS",
        "TF_NUM_INTEROP_THREADS",
        "TF_NUM_INTRAOP_THREADS",
        "TF_OVERRIDE_GLOBAL_THREADPOOL",
        "TF_USE_EIGEN_PARALLEL_FOR_IN_WORK_SHARDER",
        "TF_MATMUL_AUTOTUNE_ENABLE",
        "TF_USE_CUBLASLT",
        "TF_USE_DEEP_CONV2D",
        "TF_CONV2D_USE_FP16_ACCUMULATE",
        "TF_FP16_MATMUL_USE_FP32_COMPUTE",
        "TF_ENABLE_MAXPOOL_NANPROP",
        "TF_ENABLED_DEVICE_TYPES",
        "TF_DATA_EXPERIMENT_OPT_IN",
        "TF_DATA_EXPERIMENT_OPT_OUT",
        "TF_USE_LEGACY_KERAS",
        "TF_CONFIG",
        "KERAS_BACKEND",
        "XLA_FLAGS",
        "CUBLAS_WORKSPACE_CONFIG",
        "NVIDIA_TF32_OVERRIDE",
        "NVIDIA_VISIBLE_DEVICES",
        "PYTHONHASHSEED",
        "LD_PRELOAD",
        "GOTO_NUM_THREADS",
        "BLIS_NUM_THREADS",
        "VECLIB_MAXIMUM_THREADS",
    }
)
NUMERIC_PREFIXES = (
    "TF_CUDNN_",
    "TF_GPU_",
    "TF_ONEDNN_",
    "TF_MKL_",
    "TF_AUTO_MIXED_PRECISION_",
    "TF_FORCE_",
    "CUDA_",
    "CUDNN_",
    "NCCL_",
    "ONEDNN_",
    "DNNL_",
    "OMP_",
    "KMP_",
    "MKL_",
    "OPENBLAS_",
)
# Not recorded at all: the shell's and the job machinery's own bookkeeping, which differs
# from one run to the next without meaning anything, the key itself and the numerics list.
IGNORED_NAMES = frozenset(
    {
        "_",
        "PWD",
        "OLDPWD",
        "SHLVL",
        "REPRO_JOB_REEXEC",
        KEY_ENV,
        NUMERIC_ENV,  # recorded as the list it is ("numeric_extra")
        EXPORT_MODEL_ENV,
        "INVOCATION_ID",
        "JOURNAL_STREAM",
        "SSH_AUTH_SOCK",
        "SSH_CLIENT",
        "SSH_CONNECTION",
        "SSH_TTY",
        "XDG_SESSION_ID",
        "WINDOWID",
        "TERM_SESSION_ID",
        "TMUX_PANE",
        "PYTEST_CURRENT_TEST",
    }
)
# A name with one of these holds a secret: its value is never recorded, listed or not.
SECRET_MARKERS = ("TOKEN", "SECRET", "PASSWORD", "PASSWD", "KEY", "CREDENTIAL", "AUTH")
# A listed value such as a URL can carry a password in its value, not its name.
_URL_CREDENTIALS = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)[^/@\s]+@")
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*\*?$")


def parse_name_list(text: str | None) -> list[str]:
    """Names (or prefixes ending in `*`) from a JSON list or a comma/space separated string."""
    if not text or not text.strip():
        return []
    stripped = text.strip()
    items: Iterable[Any] = (
        json.loads(stripped) if stripped.startswith("[") else re.split(r"[\s,]+", stripped)
    )
    names = [str(item).strip() for item in items if str(item).strip()]
    bad = [name for name in names if not _NAME.match(name)]
    if bad:
        raise ValueError(f"not variable names or NAME* prefixes: {', '.join(bad)}")
    return sorted(set(names))


def is_secret(name: str) -> bool:
    """Whether the name says its value is a secret (a token, password, key...)."""
    upper = name.upper()
    return any(marker in upper for marker in SECRET_MARKERS)


def is_numeric(name: str, extra: Iterable[str] = ()) -> bool:
    """Whether the variable is known to change numerics (built-in list or `extra` names)."""
    if name in NUMERIC_NAMES or name.startswith(NUMERIC_PREFIXES):
        return True
    return any(name.startswith(item[:-1]) if item.endswith("*") else name == item for item in extra)


def key_id(key: bytes) -> str:
    """A short public name of a key: runs whose digests share it can be compared."""
    return hmac.new(key, b"reprotrain provenance key id", hashlib.sha256).hexdigest()[:16]


def keyed_digest(key: bytes, name: str, value: str) -> str:
    """HMAC-SHA256 of the value, bound to the name (one value under two names differs)."""
    message = name.encode("utf-8", "surrogateescape") + b"\0"
    message += value.encode("utf-8", "surrogateescape")
    return DIGEST_PREFIX + hmac.new(key, message, hashlib.sha256).hexdigest()


def local_key_path(environ: Mapping[str, str]) -> Path:
    """The key file of local runs: `provenance.key` in REPRO_DATA_DIR (else ~/.reprotrain)."""
    data_dir = environ.get("REPRO_DATA_DIR")
    return (Path(data_dir) if data_dir else Path.home() / ".reprotrain") / KEY_FILE


def read_or_create_key(path: Path) -> bytes:
    """The key in `path`, created once (owner-only, 32 random bytes as hex) if missing."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    try:
        # O_EXCL: two processes starting at once agree on the file that won.
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        pass
    else:
        with os.fdopen(fd, "w") as fh:
            fh.write(secrets.token_hex(32) + "\n")
    for _ in range(50):  # a concurrent creator may not have written it yet
        text = path.read_text(encoding="utf-8").strip()
        if text:
            return text.encode("utf-8")
    raise RuntimeError(f"{path} is empty; delete it to create a new provenance key")


def job_key(environ: Mapping[str, str]) -> tuple[bytes, str]:
    """The key digests are made with, and where it came from ("handed", "local", "ephemeral")."""
    handed = environ.get(KEY_ENV, "").strip()
    if handed:
        return handed.encode("utf-8"), "handed"
    try:
        return read_or_create_key(local_key_path(environ)), "local"
    except (OSError, RuntimeError):
        # No writable data directory (a read-only container): the digests still hide the
        # values, they only cannot be compared with another run's (its key id differs).
        return secrets.token_bytes(32), "ephemeral"


def claim_environment(provenance: Mapping[str, Any]) -> dict[str, str]:
    """The variables a node adds to a claimed job's environment from the claim's `provenance`.

    The operator's numerics list is merged with the one the node itself was started with.
    """
    env: dict[str, str] = {}
    key = provenance.get("key")
    if isinstance(key, str) and key:
        env[KEY_ENV] = key
    names = [str(n) for n in provenance.get("numeric_env_vars") or []]
    own = os.environ.get(NUMERIC_ENV, "")
    try:
        names += parse_name_list(own)
    except ValueError:
        # Passed on as it is: the job's capture refuses it and says so in its provenance
        # (probe_errors), where the operator sees it, instead of the agent failing the claim.
        names.append(own)
    if names:
        env[NUMERIC_ENV] = ",".join(sorted(set(names)))
    return env


def capture_environment(
    environ: Mapping[str, str] | None = None, *, key: bytes | None = None
) -> tuple[dict[str, str], dict[str, Any]]:
    """(values of the listed variables, {"key_id", "key_source", "numeric_extra", "variables"}).

    `variables` maps every other recorded name to the keyed digest of its value.
    """
    source = dict(os.environ if environ is None else environ)
    extra = parse_name_list(source.get(NUMERIC_ENV))
    source_of_key = "given"
    if key is None:
        key, source_of_key = job_key(source)
    values: dict[str, str] = {}
    digests: dict[str, str] = {}
    for name, value in source.items():
        if name in IGNORED_NAMES:
            continue
        if is_numeric(name, extra) and not is_secret(name):
            values[name] = _URL_CREDENTIALS.sub(r"\g<scheme>***@", value)
        else:
            digests[name] = keyed_digest(key, name, value)
    return dict(sorted(values.items())), {
        "key_id": key_id(key),
        "key_source": source_of_key,
        "numeric_extra": extra,
        "variables": dict(sorted(digests.items())),
    }


# -- diff ----------------------------------------------------------------------------------

_WHY_NUMERIC = "an environment variable read by TensorFlow, CUDA or the math libraries"
_WHY_OPERATOR = "an environment variable the operator lists as changing numerics"
_WHY_SETTING = "a Reprotrain setting of the service or agent: the numerics never read it"
_WHY_UNLISTED = (
    "an environment variable no list names (only a keyed digest of its value is recorded): "
    "a library or plugin that reads it could change results"
)
_WHY_KEYS = (
    "the value digests were made with different keys: variables set in both runs "
    "cannot be compared, only whether each is set"
)


def _classify(name: str, extra: Iterable[str]) -> tuple[bool, str]:
    if is_numeric(name):
        return True, _WHY_NUMERIC
    if is_numeric(name, extra):
        return True, _WHY_OPERATOR
    if name.startswith("REPRO_"):
        return False, _WHY_SETTING
    return False, _WHY_UNLISTED


def _shown(value: Any, *, hidden: bool) -> Any:
    # What the diff shows of one side: None when unset, never a hidden value.
    if value is None or not hidden:
        return value
    return f"hidden:{str(value).removeprefix(DIGEST_PREFIX)[:_SHOWN_HEX]}"


def diff_environment(a: Mapping[str, Any], b: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Entries like diff_provenance's for the environment of two provenance records.

    `environment.NAME` names one variable; a variable recorded only as a digest shows as
    `hidden:<first hex digits of its digest>` (None: unset), never by value. Older records
    (values of REPRO_*/TF_*/... variables, no digests) compare by name and value.
    """
    values_a: Mapping[str, Any] = a.get("environment") or {}
    values_b: Mapping[str, Any] = b.get("environment") or {}
    digests_a: Mapping[str, Any] = a.get("environment_digests") or {}
    digests_b: Mapping[str, Any] = b.get("environment_digests") or {}
    hidden_a: Mapping[str, Any] = digests_a.get("variables") or {}
    hidden_b: Mapping[str, Any] = digests_b.get("variables") or {}
    extra = {*(digests_a.get("numeric_extra") or []), *(digests_b.get("numeric_extra") or [])}
    same_key = digests_a.get("key_id") == digests_b.get("key_id")
    entries: list[dict[str, Any]] = []
    if digests_a and digests_b and not same_key:
        entries.append(
            {
                "field": "environment_digests.key_id",
                "a": digests_a.get("key_id"),
                "b": digests_b.get("key_id"),
                "breaks_reproducibility": False,
                "why": _WHY_KEYS,
            }
        )
    names = set(values_a) | set(values_b) | set(hidden_a) | set(hidden_b)
    for name in sorted(names):
        in_hidden_a, in_hidden_b = name in hidden_a, name in hidden_b
        side_a = hidden_a.get(name) if in_hidden_a else values_a.get(name)
        side_b = hidden_b.get(name) if in_hidden_b else values_b.get(name)
        if side_a is None and side_b is None:
            continue
        if in_hidden_a and in_hidden_b and not same_key:
            continue  # set in both; whether the values differ cannot be told
        if side_a == side_b and in_hidden_a == in_hidden_b:
            continue
        breaking, why = _classify(str(name), extra)
        entries.append(
            {
                "field": f"environment.{name}",
                "a": _shown(side_a, hidden=in_hidden_a),
                "b": _shown(side_b, hidden=in_hidden_b),
                "breaks_reproducibility": breaking,
                "why": why,
            }
        )
    return entries


def unlisted_variables(diff: Iterable[Mapping[str, Any]]) -> list[str]:
    """Names of the differing variables that no list names (they may still change results)."""
    return [
        str(d["field"]).removeprefix("environment.")
        for d in diff
        if d.get("why") == _WHY_UNLISTED and str(d.get("field", "")).startswith("environment.")
    ]
