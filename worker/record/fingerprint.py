"""Weight fingerprints: digests of tensor values, never of saved files.

A variable's digest covers (path, dtype, shape, little-endian bytes); a state's
fingerprint is `<algorithm>:<hex>` over the ordered (path, variable digest) entries.
Needs NumPy and blake3 only: variables are read by `worker.record.variable_reads` (TensorFlow's
and Keras's without a copy, TensorFlow used only when it is already imported). Small
variables are hashed on several threads: the hash functions release the GIL, and a model's
many small variables otherwise leave all but one core idle.
"""

from __future__ import annotations

import hashlib
import os
import threading
from collections.abc import Iterable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Protocol

import blake3
import numpy as np

from worker.record.variable_reads import TrainingState, Variable, read_state

DEFAULT_ALGORITHM = "blake3"
ALGORITHMS = ("blake3", "sha256")
# Below this many bytes a thread pool costs more than it saves.
_THREADED_HASH_BYTES = 1 << 22
# Below this many bytes of small arrays in all, waking a hash thread costs more than it saves.
_POOL_MIN_BYTES = 1 << 17
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


def _header_bytes(path: str, dtype: np.dtype[Any], shape: tuple[int, ...]) -> bytes:
    dims = ",".join(str(d) for d in shape)
    return f"{path}\0{dtype.name}\0[{dims}]\0".encode()


# Headers repeat from one trace point to the next: the same paths, dtypes and shapes.
_cached_header = lru_cache(maxsize=4096)(_header_bytes)


def _header(path: str, array: np.ndarray) -> bytes:
    return _header_bytes(path, array.dtype, array.shape)


def _hash_one(header: bytes, data: np.ndarray, algorithm: str) -> bytes:
    """The digest of one variable: its header, then its bytes."""
    h = new_hash(algorithm, size_hint=data.nbytes)
    h.update(header)
    h.update(data)
    return h.digest()


def variable_digest(path: str, array: np.ndarray, algorithm: str = DEFAULT_ALGORITHM) -> str:
    """Hex digest of one tensor: its path, dtype, shape and little-endian bytes."""
    array = _little_endian(np.asarray(array))
    return _hash_one(_header(path, array), _raw_bytes(array), algorithm).hex()


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


_pool: tuple[ThreadPoolExecutor, int] | None = None
_pool_sized = False
_pool_lock = threading.Lock()


def _hash_pool() -> tuple[ThreadPoolExecutor, int] | None:
    """Threads that hash beside the calling one and their number (None on one CPU).

    Sized by the CPUs this process may use when it is first asked for.
    """
    global _pool, _pool_sized
    if not _pool_sized:
        with _pool_lock:
            if not _pool_sized:
                workers = min(_cpus(), _MAX_HASH_THREADS) - 1
                if workers >= 1:
                    _pool = (
                        ThreadPoolExecutor(workers, thread_name_prefix="fingerprint-hash"),
                        workers,
                    )
                _pool_sized = True
    return _pool


def _forget_pool_after_fork() -> None:
    # A forked child has none of its parent's threads: it makes its own pool if it needs one.
    global _pool, _pool_sized, _pool_lock
    _pool, _pool_sized, _pool_lock = None, False, threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_pool_after_fork)


@dataclass(frozen=True)
class _Plan:
    """Which thread hashes which array: lanes[0] is the calling thread's, the others go to
    the hash threads; `large` arrays are hashed last, each by the hash's own threads."""

    workers: int  # hash threads beside the calling one
    lanes: list[list[int]]
    large: list[int]


def _make_plan(sizes: Sequence[int]) -> _Plan:
    """Arrays under 4 MiB in `workers + 1` lanes of about equal work (largest first)."""
    pool = _hash_pool()
    workers = pool[1] if pool is not None else 0
    small = [i for i, size in enumerate(sizes) if size < _THREADED_HASH_BYTES]
    large = [i for i, size in enumerate(sizes) if size >= _THREADED_HASH_BYTES]
    if workers < 1 or sum(sizes[i] for i in small) < _POOL_MIN_BYTES:
        return _Plan(workers, [small], large)
    lanes: list[list[int]] = [[] for _ in range(workers + 1)]
    loads = [0] * len(lanes)  # in bytes hashed meanwhile
    for i in sorted(small, key=sizes.__getitem__, reverse=True):
        k = loads.index(min(loads))
        lanes[k].append(i)
        loads[k] += sizes[i] + 64  # a hash call costs about as much as 64 more bytes
    return _Plan(workers, lanes, large)


def _fingerprint(
    paths: Sequence[str], arrays: Sequence[np.ndarray], plan: _Plan, algorithm: str
) -> StateFingerprint:
    """Fingerprint of arrays by path.

    The lanes of the plan hash side by side, since each hash call releases the GIL. Each
    thread's lane is prepared (headers, byte views) before it is handed over, and the
    calling thread prepares its own while the others hash. Arrays from 4 MiB up are then
    hashed one at a time by the hash's own threads. Handing each array to a thread as soon
    as it is prepared was slower: the threads then wait for the GIL on every array.
    """
    new_hash(algorithm)  # an unknown algorithm fails here, not on a hash thread
    seen: set[str] = set()
    for path in paths:
        if path in seen:
            raise ValueError(f"duplicate variable path {path!r}")
        seen.add(path)
    ready: dict[int, tuple[bytes, np.ndarray]] = {}
    digests = [b""] * len(paths)

    def load_lane(lane: list[int]) -> None:
        # The hash threads get everything but the hashing done: any Python step of theirs
        # waits for the GIL while this thread reads the next lane.
        for i in lane:
            array = _little_endian(np.asarray(arrays[i]))
            # Headers repeat from one trace point to the next: same paths, dtypes and shapes.
            ready[i] = _cached_header(paths[i], array.dtype, array.shape), _raw_bytes(array)

    def hash_lane(lane: list[int]) -> None:
        for i in lane:
            digests[i] = _hash_one(*ready[i], algorithm)

    pool = _hash_pool()
    futures: list[Future[None]] = []
    for lane in plan.lanes[1:]:
        load_lane(lane)
        if pool is not None and pool[1] == plan.workers:
            futures.append(pool[0].submit(hash_lane, lane))
        else:  # a plan made before this process forked
            hash_lane(lane)
    load_lane(plan.lanes[0])
    hash_lane(plan.lanes[0])
    for future in futures:
        future.result()
    load_lane(plan.large)
    hash_lane(plan.large)
    variables = {path: digest.hex() for path, digest in zip(paths, digests, strict=True)}
    return StateFingerprint(combine(variables.items(), algorithm), variables)


def fingerprint_arrays(
    entries: Iterable[tuple[str, np.ndarray]], algorithm: str = DEFAULT_ALGORITHM
) -> StateFingerprint:
    """Fingerprint of ordered (path, array) entries; paths must be unique."""
    paths: list[str] = []
    arrays: list[np.ndarray] = []
    sizes: list[int] = []
    for path, array in entries:
        array = np.asarray(array)
        paths.append(path)
        arrays.append(array)
        sizes.append(array.nbytes)
    return _fingerprint(paths, arrays, _make_plan(sizes), algorithm)


def fingerprint_state(
    state: Sequence[tuple[str, Variable]], algorithm: str = DEFAULT_ALGORITHM
) -> StateFingerprint:
    """Fingerprint of `training_state(...)` entries, read from the variables now.

    From the second fingerprint of a `TrainingState` on, every variable is read by one op
    before the hashing starts (see `worker.record.variable_reads`), and the lanes are the ones
    planned at the first fingerprint, kept on the state.
    """
    return fingerprint_read(state, algorithm)[0]


def fingerprint_read(
    state: Sequence[tuple[str, Variable]], algorithm: str = DEFAULT_ALGORITHM
) -> tuple[StateFingerprint, list[np.ndarray]]:
    """`fingerprint_state`, and the values it read (a checkpoint of the same moment
    writes them without reading the variables again)."""
    arrays = read_state(state)
    paths = [path for path, _ in state]
    plan = state.lane_plan if isinstance(state, TrainingState) else None
    if not isinstance(plan, _Plan):
        plan = _make_plan([a.nbytes for a in arrays])
        if isinstance(state, TrainingState):
            state.lane_plan = plan
    return _fingerprint(paths, arrays, plan, algorithm), arrays


class StreamDigest:
    """Incremental digest over a sequence of named arrays (used for data fingerprints)."""

    def __init__(self, algorithm: str = DEFAULT_ALGORITHM) -> None:
        self.algorithm = algorithm
        self._hash = new_hash(algorithm)

    def add_array(self, name: str, array: np.ndarray) -> None:
        """Feed one array (its name, dtype, shape and little-endian bytes; an array of
        strings, as TensorFlow gives a string tensor, each element's length and bytes)."""
        array = np.asarray(array)
        if array.dtype == object:
            self._hash.update(_header_bytes(name, np.dtype("S"), array.shape))
            for item in array.reshape(-1):
                data = item if isinstance(item, bytes) else str(item).encode()
                self._hash.update(len(data).to_bytes(8, "little") + data)
            return
        array = _little_endian(array)
        self._hash.update(_header(name, array))
        self._hash.update(_raw_bytes(array))

    def add_batch(self, batch_id: int, leaves: Iterable[Any]) -> None:
        """Feed one batch's leaves (arrays, or tensors), named `<batch id>/<leaf id>`: the
        names a data fingerprint gives them, wherever the batch is read."""
        for leaf_id, leaf in enumerate(leaves):
            self.add_array(f"{batch_id}/{leaf_id}", leaf)

    def hexdigest(self) -> str:
        """`<algorithm>:<hex>` of everything fed so far."""
        return f"{self.algorithm}:{self._hash.digest().hex()}"
