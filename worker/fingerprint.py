"""Weight fingerprints: digests of tensor values, never of saved files.

A variable's digest covers (path, dtype, shape, little-endian bytes); a state's
fingerprint is `<algorithm>:<hex>` over the ordered (path, variable digest) entries.
Needs NumPy and blake3 only: variables are read through `.path` and `.numpy()`, or, for
TensorFlow and Keras variables, with one `ReadVariableOp` each, which avoids a copy (TensorFlow
is used only when it is already imported). Small variables are hashed on several threads:
the hash functions release the GIL, and a model's many small variables otherwise leave all
but one core idle.
"""

from __future__ import annotations

import hashlib
import os
import sys
import threading
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Protocol

import blake3
import numpy as np

DEFAULT_ALGORITHM = "blake3"
ALGORITHMS = ("blake3", "sha256")
# Below this many bytes a thread pool costs more than it saves.
_THREADED_HASH_BYTES = 1 << 22
# Small arrays go to the hash threads in chunks of about this many bytes: hashing one takes
# about 50 us, several times what handing it over costs.
_CHUNK_BYTES = 1 << 18
_MAX_HASH_THREADS = 8


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


def _digest(path: str, array: np.ndarray, algorithm: str) -> str:
    # `array` is already contiguous and little-endian.
    h = new_hash(algorithm, size_hint=array.nbytes)
    h.update(_header(path, array))
    h.update(_raw_bytes(array))
    return h.digest().hex()


def variable_digest(path: str, array: np.ndarray, algorithm: str = DEFAULT_ALGORITHM) -> str:
    """Hex digest of one tensor: its path, dtype, shape and little-endian bytes."""
    return _digest(path, _little_endian(np.asarray(array)), algorithm)


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


def _cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on every platform
        return os.cpu_count() or 1


_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


def _hash_pool() -> tuple[ThreadPoolExecutor, int] | None:
    """Threads that hash beside the calling one and their number (None on one CPU)."""
    global _pool
    workers = min(_cpus(), _MAX_HASH_THREADS) - 1
    if workers < 1:
        return None
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(workers, thread_name_prefix="fingerprint-hash")
        return _pool, workers


def _forget_pool_after_fork() -> None:
    # A forked child has none of its parent's threads: it makes its own pool if it needs one.
    global _pool, _pool_lock
    _pool, _pool_lock = None, threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_pool_after_fork)


def fingerprint_arrays(
    entries: Iterable[tuple[str, np.ndarray]], algorithm: str = DEFAULT_ALGORITHM
) -> StateFingerprint:
    """Fingerprint of ordered (path, array) entries; paths must be unique.

    Small arrays go to the hash threads in chunks as the entries are consumed; chunks no
    thread has started when the entries run out are hashed on the calling thread, and
    arrays from 4 MiB up by the hash's own threads, one at a time.
    """
    new_hash(algorithm)  # an unknown algorithm fails here, not on a hash thread
    pool = _hash_pool()
    paths: list[str] = []
    arrays: list[np.ndarray] = []
    digests: list[str] = []
    seen: set[str] = set()

    def hash_lane(lane: list[int]) -> None:
        for i in lane:
            digests[i] = _digest(paths[i], arrays[i], algorithm)

    sent: list[tuple[Future[None], list[int]]] = []
    chunk: list[int] = []
    chunk_bytes = 0
    large: list[int] = []
    for path, array in entries:
        if path in seen:
            raise ValueError(f"duplicate variable path {path!r}")
        seen.add(path)
        array = _little_endian(np.asarray(array))
        paths.append(path)
        arrays.append(array)
        digests.append("")
        if array.nbytes >= _THREADED_HASH_BYTES:
            large.append(len(arrays) - 1)  # the hash's own threads take it, below
            continue
        chunk.append(len(arrays) - 1)
        chunk_bytes += array.nbytes
        if pool is not None and chunk_bytes >= _CHUNK_BYTES:
            sent.append((pool[0].submit(hash_lane, chunk), chunk))
            chunk, chunk_bytes = [], 0
    hash_lane(chunk)
    for future, lane in reversed(sent):  # the threads work from the front, this one from the back
        if future.cancel():
            hash_lane(lane)
    hash_lane(large)
    for future, _ in sent:
        if not future.cancelled():
            future.result()
    variables = dict(zip(paths, digests, strict=True))
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


def _variable_reader() -> Callable[..., Any] | None:
    """TensorFlow's ReadVariableOp if TensorFlow is loaded (else no TensorFlow variable exists)."""
    tf = sys.modules.get("tensorflow")
    raw_ops = getattr(tf, "raw_ops", None)
    reader = getattr(raw_ops, "ReadVariableOp", None)
    return reader if callable(reader) else None


def _read_variable(variable: _Variable, reader: Callable[..., Any] | None = None) -> np.ndarray:
    """The current value of a variable, equal to `np.asarray(variable.numpy())`.

    TensorFlow's `.numpy()` copies the whole buffer, which takes longer than hashing it.
    A `ReadVariableOp` returns a tensor sharing the variable's buffer (TensorFlow copies on
    write while such a tensor is alive, so it stays a snapshot) and NumPy views a CPU
    tensor without copying. It is run directly rather than through `read_value()`, whose
    name scope, gradient-tape check and extra `identity` op took most of a small model's
    fingerprint; and eagerly rather than as one compiled read of every variable, because
    the compiled read is instantiated again whenever TensorFlow's caches are cleared, as
    `tf.random.set_seed` does (20 ms against 2 ms per trace point in a job that reseeds
    TensorFlow every epoch, as jobs with stateful random ops still do). A Keras
    variable holds its backend variable in `.value`, which is also what its `.numpy()` reads.
    """
    holders: tuple[Any, ...] = (getattr(variable, "value", None), variable)  # a method on tf
    if reader is not None:
        for holder in holders:
            try:
                handle, dtype = holder.handle, holder.dtype
            except (AttributeError, ValueError):  # not a plain resource variable (mirrored)
                continue
            try:
                return np.asarray(reader(resource=handle, dtype=dtype))
            except (TypeError, ValueError):
                break  # dtypes NumPy cannot view in place (bfloat16 tensors): copy instead
    for holder in holders:
        read_value = getattr(holder, "read_value", None)
        if callable(read_value):
            try:
                return np.asarray(read_value())
            except (TypeError, ValueError):
                break
    return np.asarray(variable.numpy())


def read_state(state: Sequence[tuple[str, _Variable]]) -> list[np.ndarray]:
    """The current values of `training_state(...)` entries, as NumPy views where possible."""
    reader = _variable_reader()
    return [_read_variable(v, reader) for _, v in state]


def fingerprint_state(
    state: Sequence[tuple[str, _Variable]], algorithm: str = DEFAULT_ALGORITHM
) -> StateFingerprint:
    """Fingerprint of `training_state(...)` entries, read from the variables now."""
    # Every read first, then the hashing: reads interleaved with hash threads were slower,
    # since both want the GIL between their steps.
    arrays = read_state(state)
    return fingerprint_arrays(zip((path for path, _ in state), arrays, strict=True), algorithm)


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
