"""Weight fingerprints: digests of tensor values, never of saved files.

A variable's digest covers (path, dtype, shape, little-endian bytes); a state's
fingerprint is `<algorithm>:<hex>` over the ordered (path, variable digest) entries.
Needs NumPy and blake3 only: variables are read through `.path` and `.numpy()`, or through
`read_value()` when they have it (TensorFlow and Keras variables), which avoids a copy.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import blake3
import numpy as np

DEFAULT_ALGORITHM = "blake3"
ALGORITHMS = ("blake3", "sha256")
# Below this many bytes a thread pool costs more than it saves.
_THREADED_HASH_BYTES = 1 << 22


class _Hash(Protocol):
    def update(self, data: Any, /) -> Any: ...
    def digest(self) -> bytes: ...


def new_hash(algorithm: str = DEFAULT_ALGORITHM, *, size_hint: int = 0) -> _Hash:
    """A fresh hash object of a named algorithm."""
    if algorithm == "blake3":
        threads = blake3.blake3.AUTO if size_hint >= _THREADED_HASH_BYTES else 1
        return blake3.blake3(max_threads=threads)
    if algorithm == "sha256":
        return hashlib.sha256()
    raise ValueError(f"unknown hash algorithm {algorithm!r}; known: {', '.join(ALGORITHMS)}")


def _little_endian(array: np.ndarray) -> np.ndarray:
    array = np.ascontiguousarray(array)
    if array.dtype.byteorder == ">":
        array = array.astype(array.dtype.newbyteorder("<"))
    return array


def _raw_bytes(array: np.ndarray) -> np.ndarray:
    # A byte view, not a copy; works for extension dtypes (bfloat16) that memoryview rejects.
    return array.reshape(-1).view(np.uint8)


def _header(path: str, array: np.ndarray) -> bytes:
    shape = ",".join(str(d) for d in array.shape)
    return f"{path}\0{array.dtype.name}\0[{shape}]\0".encode()


def variable_digest(path: str, array: np.ndarray, algorithm: str = DEFAULT_ALGORITHM) -> str:
    """Hex digest of one tensor: its path, dtype, shape and little-endian bytes."""
    array = _little_endian(np.asarray(array))
    h = new_hash(algorithm, size_hint=array.nbytes)
    h.update(_header(path, array))
    h.update(_raw_bytes(array))
    return h.digest().hex()


@dataclass(frozen=True)
class StateFingerprint:
    """The fingerprint of a set of variables and the digest of each."""

    fingerprint: str  # "<algorithm>:<hex>"
    variables: dict[str, str]  # path -> hex digest, in fingerprint order


def combine(entries: Iterable[tuple[str, str]], algorithm: str = DEFAULT_ALGORITHM) -> str:
    """`<algorithm>:<hex>` over ordered (path, hex digest) entries."""
    h = new_hash(algorithm)
    for path, hexdigest in entries:
        h.update(path.encode() + b"\0" + bytes.fromhex(hexdigest))
    return f"{algorithm}:{h.digest().hex()}"


def fingerprint_arrays(
    entries: Iterable[tuple[str, np.ndarray]], algorithm: str = DEFAULT_ALGORITHM
) -> StateFingerprint:
    """Fingerprint of ordered (path, array) entries; paths must be unique."""
    variables: dict[str, str] = {}
    for path, array in entries:
        if path in variables:
            raise ValueError(f"duplicate variable path {path!r}")
        variables[path] = variable_digest(path, array, algorithm)
    return StateFingerprint(combine(variables.items(), algorithm), variables)


class _Variable(Protocol):
    path: str

    def numpy(self) -> np.ndarray: ...


def unique_paths(paths: Sequence[str]) -> list[str]:
    """Paths made unique in order: a repeated `p` becomes `p#1`, `p#2`, ..."""
    seen: dict[str, int] = {}
    out = []
    for path in paths:
        n = seen.get(path, 0)
        seen[path] = n + 1
        out.append(path if n == 0 else f"{path}#{n}")
    return out


def training_state(model: Any, optimizer: Any | None = None) -> list[tuple[str, _Variable]]:
    """Every variable that determines how training continues, with stable unique paths.

    Model variables (weights, BatchNorm statistics, dropout seed-generator states) come
    first under `model/`, then the optimizer's (iteration count, moments) under
    `optimizer/`. Order is the framework's creation order, which is deterministic.
    """
    variables: list[_Variable] = list(model.variables)
    prefixes = ["model/"] * len(variables)
    if optimizer is not None:
        opt_vars = list(optimizer.variables)
        variables += opt_vars
        prefixes += ["optimizer/"] * len(opt_vars)
    paths = unique_paths([p + v.path for p, v in zip(prefixes, variables, strict=True)])
    return list(zip(paths, variables, strict=True))


def _read_variable(variable: _Variable) -> np.ndarray:
    """The current value of a variable, equal to `np.asarray(variable.numpy())`.

    TensorFlow's `.numpy()` copies the whole buffer, which takes longer than hashing it.
    `read_value()` returns a tensor sharing the variable's buffer (TensorFlow copies on
    write while such a tensor is alive, so it stays a snapshot) and NumPy views a CPU
    tensor without copying. A Keras variable holds its backend variable in `.value`,
    which is also what its `.numpy()` reads.
    """
    for holder in (getattr(variable, "value", None), variable):
        read_value = getattr(holder, "read_value", None)
        if callable(read_value):
            try:
                return np.asarray(read_value())
            except (TypeError, ValueError):
                break  # dtypes NumPy cannot view in place (bfloat16 tensors): copy instead
    return np.asarray(variable.numpy())


def fingerprint_state(
    state: Sequence[tuple[str, _Variable]], algorithm: str = DEFAULT_ALGORITHM
) -> StateFingerprint:
    """Fingerprint of `training_state(...)` entries, read from the variables now."""
    return fingerprint_arrays(((path, _read_variable(v)) for path, v in state), algorithm)


class StreamDigest:
    """Incremental digest over a sequence of named arrays (used for data fingerprints)."""

    def __init__(self, algorithm: str = DEFAULT_ALGORITHM) -> None:
        self.algorithm = algorithm
        self._hash = new_hash(algorithm)

    def add_array(self, name: str, array: np.ndarray) -> None:
        """Feed one array (its name, dtype, shape and little-endian bytes)."""
        array = _little_endian(np.asarray(array))
        self._hash.update(_header(name, array))
        self._hash.update(_raw_bytes(array))

    def hexdigest(self) -> str:
        """`<algorithm>:<hex>` of everything fed so far."""
        return f"{self.algorithm}:{self._hash.digest().hex()}"
