"""Checkpoints of the full training state at epoch ends and every K steps, written atomically.

A checkpoint is `epoch-NNNNNN.npz` (the arrays) plus `epoch-NNNNNN.json` (manifest,
metadata and the npz's SHA-256), or `step-NNNNNNNNN.*` (global step) for one taken
mid-epoch. The JSON is written last, so a checkpoint without it is incomplete and
ignored; one whose npz digest does not match is corrupt and skipped.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import zipfile  # noqa: F401  np.savez imports it on first use: 5 ms, better spent at start-up
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from worker.errors import CheckpointError, CheckpointRefused
from worker.record.durable import fsync_path
from worker.record.fingerprint import DEFAULT_ALGORITHM, StateFingerprint, fingerprint_arrays
from worker.record.npz_reader import Member, inspect_npz, iter_arrays
from worker.record.variable_reads import read_state

_NAME = re.compile(r"^(?:epoch-(\d{6})|step-(\d{9}))\.json$")
# A checkpoint's JSON holds its manifest and the trace so far; far below this in practice.
MAX_MANIFEST_BYTES = 256 * 1024**2
# States up to this size are packed in memory before they are written (see save_checkpoint);
# larger ones are written straight to the file, so a checkpoint never holds a second copy.
PACK_IN_MEMORY_BYTES = 64 * 1024**2


@dataclass(frozen=True)
class Checkpoint:
    """A loaded checkpoint: the state after `step` global steps.

    An epoch checkpoint (`batch` None) holds `epoch` complete epochs; a step checkpoint
    holds `batch` batches of epoch `epoch`, which is still in progress.
    """

    path: Path
    epoch: int
    step: int
    meta: dict[str, Any]
    manifest: list[dict[str, Any]]
    arrays: list[np.ndarray]
    batch: int | None = None

    @property
    def kind(self) -> str:
        """ "epoch" or "step"."""
        return "epoch" if self.batch is None else "step"


class Syncer:
    """Makes written checkpoints durable on a thread of its own.

    A checkpoint is complete for every reader, and for a resume after the process is
    killed, once its JSON is renamed into place; the fsyncs only guard against the
    machine itself going down, so training need not wait for them. `close()` waits for
    all of them and raises CheckpointError if one failed. Should the machine go down
    before a sync, the npz on disk may no longer match the digest in its JSON (or the JSON
    may be missing); such a checkpoint is skipped in favour of an older one.
    """

    def __init__(self) -> None:
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="checkpoint-sync")
        self._pending: list[Future[None]] = []

    def sync(self, *paths: Path) -> None:
        """fsync the files, then their directories, in the background."""
        self._pending = [f for f in self._pending if not f.done() or f.exception()]
        try:
            self._pending.append(self._pool.submit(self._sync, paths))
        except RuntimeError:  # the interpreter is exiting and has stopped its pools: now
            self._sync(paths)

    @staticmethod
    def _sync(paths: tuple[Path, ...]) -> None:
        for path in paths:
            fsync_path(path)
        for directory in dict.fromkeys(path.parent for path in paths):
            fsync_path(directory)

    def close(self) -> None:
        """Wait until everything written is on disk."""
        self._pool.shutdown(wait=True)
        for future in self._pending:
            if (exc := future.exception()) is not None:
                raise CheckpointError(f"a checkpoint could not be synced to disk: {exc}") from exc
        self._pending = []


def _sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _write(path: Path, write: Callable[[BinaryIO], object], syncer: Syncer | None) -> None:
    """Write a file under a temporary name and rename it; synced now unless `syncer` is given."""
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "wb") as fh:
        write(fh)
        if syncer is None:
            fh.flush()
            os.fsync(fh.fileno())
    os.replace(tmp, path)


def save_checkpoint(
    directory: Path,
    *,
    epoch: int,
    step: int,
    state: Sequence[tuple[str, Any]],
    meta: dict[str, Any],
    batch: int | None = None,
    arrays: Sequence[np.ndarray] | None = None,
    syncer: Syncer | None = None,
) -> Path:
    """Write the variables of `state` ((path, variable) pairs) and `meta`; returns the JSON path.

    With `batch` it is a step checkpoint: `batch` batches of epoch `epoch` are done.
    `arrays` are the variables' values if the caller has read them already. With a
    `syncer`, the files are synced to disk in the background (see `Syncer`).
    """
    directory.mkdir(parents=True, exist_ok=True)
    stem = f"epoch-{epoch:06d}" if batch is None else step_stem(step)
    values = list(arrays) if arrays is not None else read_state(state)
    manifest = [
        {"path": path, "dtype": value.dtype.name, "shape": list(value.shape)}
        for (path, _), value in zip(state, values, strict=True)
    ]
    npz_path = directory / f"{stem}.npz"
    members = {f"v{i}": value for i, value in enumerate(values)}
    if sum(value.nbytes for value in values) <= PACK_IN_MEMORY_BYTES:
        # Packed in memory, written at once and hashed there, not read back from the file
        # (zipfile seeks back to each member's header, and on a file each seek flushes):
        # the same bytes, and 0.2 ms less for a step checkpoint of 1 MB of state.
        buffer = io.BytesIO()
        np.savez(buffer, **members)  # type: ignore[arg-type]
        packed = buffer.getbuffer()
        _write(npz_path, lambda fh: fh.write(packed), syncer)
        arrays_sha256 = hashlib.sha256(packed).hexdigest()
    else:
        _write(npz_path, lambda fh: np.savez(fh, **members), syncer)  # type: ignore[arg-type]
        arrays_sha256 = _sha256_file(npz_path)
    doc: dict[str, Any] = {
        "format": 1,
        "kind": "epoch" if batch is None else "step",
        "epoch": epoch,
        "step": step,
        **({} if batch is None else {"batch": batch}),
        "arrays": npz_path.name,
        "arrays_sha256": arrays_sha256,
        "manifest": manifest,
        "meta": meta,
    }
    json_path = directory / f"{stem}.json"
    text = json.dumps(doc, separators=(",", ":")).encode()
    _write(json_path, lambda fh: fh.write(text), syncer)
    if syncer is not None:
        syncer.sync(npz_path, json_path)
    return json_path


def step_stem(step: int) -> str:
    """The file stem of the step checkpoint after global step `step`."""
    return f"step-{step:09d}"


def _position(path: Path) -> tuple[int, int]:
    """(global step, 1 for an epoch checkpoint else 0): training order, epoch ends last."""
    match = _NAME.match(path.name)
    if match is not None and match.group(2) is not None:
        return int(match.group(2)), 0
    try:  # an epoch checkpoint's name has no step; its JSON does
        return int(json.loads(path.read_text())["step"]), 1
    except (OSError, ValueError, KeyError, TypeError):
        return -1, 1  # unreadable: tried last, and reported when loading fails


def list_checkpoints(directory: Path) -> list[Path]:
    """Checkpoint JSON files (epoch and step) in the directory, oldest global step first."""
    if not directory.is_dir():
        return []
    found = sorted(p for p in directory.iterdir() if _NAME.match(p.name))
    return sorted(found, key=_position)


def _read_doc(json_path: Path) -> dict[str, Any]:
    try:
        doc = json.loads(json_path.read_text())
        if not isinstance(doc, dict) or not isinstance(doc.get("meta"), dict):
            raise ValueError("not a checkpoint document")
        return doc
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"{json_path.name}: unreadable checkpoint ({exc})") from exc


def load_checkpoint(json_path: Path, doc: dict[str, Any] | None = None) -> Checkpoint:
    """Read and verify one checkpoint; CheckpointError if it is incomplete or corrupt."""
    try:
        doc = doc if doc is not None else _read_doc(json_path)
        npz_path = json_path.with_name(doc["arrays"])
        if _sha256_file(npz_path) != doc["arrays_sha256"]:
            raise CheckpointError(f"{npz_path.name}: contents do not match the recorded digest")
        names = [f"v{i}" for i in range(len(doc["manifest"]))]
        members = inspect_npz(npz_path, max_members=len(names), max_bytes=None)
        arrays = [array for _, array in iter_arrays(npz_path, members, names)]
        batch = int(doc["batch"]) if doc.get("kind") == "step" else None
        return Checkpoint(
            json_path,
            int(doc["epoch"]),
            int(doc["step"]),
            doc["meta"],
            doc["manifest"],
            arrays,
            batch,
        )
    except CheckpointError:
        raise
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise CheckpointError(f"{json_path.name}: unreadable checkpoint ({exc})") from exc


def load_latest(
    directory: Path, *, spec_hash: str, replicas: int = 1
) -> tuple[Checkpoint | None, list[str]]:
    """The newest intact checkpoint of this experiment, and warnings about skipped ones.

    A checkpoint of another spec or another replica count is skipped before its arrays
    are read. Checkpoints written before replicas existed count as one replica.
    """
    warnings: list[str] = []
    for json_path in reversed(list_checkpoints(directory)):
        try:
            doc = _read_doc(json_path)
            theirs = doc["meta"].get("replicas", 1)
            if theirs != replicas:
                warnings.append(
                    f"skipped checkpoint {json_path.name}: it was written with {theirs} "
                    f"replica(s), this job has {replicas}"
                )
                continue
            if doc["meta"].get("spec_hash") != spec_hash:
                warnings.append(f"skipped checkpoint {json_path.name}: it belongs to another spec")
                continue
            return load_checkpoint(json_path, doc), warnings
        except CheckpointError as exc:
            warnings.append(f"skipped checkpoint: {exc}")
    return None, warnings


def restore(ckpt: Checkpoint, state: Sequence[tuple[str, Any]]) -> None:
    """Assign the checkpoint's arrays to `state`'s variables, checking that they match."""
    if [m["path"] for m in ckpt.manifest] != [path for path, _ in state]:
        raise CheckpointError(
            f"{ckpt.path.name}: its variables do not match this model "
            f"({len(ckpt.manifest)} saved, {len(state)} in the model)"
        )
    for (path, var), array in zip(state, ckpt.arrays, strict=True):
        if tuple(var.shape) != array.shape:
            raise CheckpointError(f"{path}: saved shape {array.shape} != model {tuple(var.shape)}")
        var.assign(array)


def checkpoint_step(name: str) -> int | None:
    """The global step of a step checkpoint file name (`step-000000030.json` or `.npz`)."""
    match = re.match(r"^step-(\d{9})\.(?:json|npz)$", Path(name).name)
    return int(match.group(1)) if match else None


def checkpoint_epoch(name: str) -> int | None:
    """The epoch of a checkpoint file name (`epoch-000003.json` or `.npz`), else None."""
    match = re.match(r"^epoch-(\d{6})\.(?:json|npz)$", Path(name).name)
    return int(match.group(1)) if match else None


def read_variables(
    json_path: Path,
    paths: Sequence[str],
    *,
    npz_path: Path | None = None,
    verify: bool = True,
    max_bytes: int | None = None,
) -> dict[str, np.ndarray]:
    """Only the named variables of one checkpoint, found through its JSON manifest.

    `npz_path` overrides where the arrays are (a content-addressed store renames them);
    `verify` checks the npz against the digest in the JSON first. CheckpointError if the
    checkpoint is unreadable or does not match its digest; CheckpointRefused (a subclass)
    if its arrays are not plain numbers or declare more than `max_bytes` (see `read_arrays`).
    """
    try:
        if Path(json_path).stat().st_size > MAX_MANIFEST_BYTES:
            raise CheckpointRefused(f"{Path(json_path).name}: larger than {MAX_MANIFEST_BYTES} B")
        doc = json.loads(Path(json_path).read_text())
        arrays_path = Path(npz_path) if npz_path is not None else json_path.with_name(doc["arrays"])
        if verify and _sha256_file(arrays_path) != doc["arrays_sha256"]:
            raise CheckpointError(f"{arrays_path.name}: contents do not match the recorded digest")
        order = [str(m["path"]) for m in doc["manifest"]]
        return read_arrays(arrays_path, order, paths, max_bytes=max_bytes)
    except CheckpointError:
        raise
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise CheckpointError(f"{Path(json_path).name}: unreadable checkpoint ({exc})") from exc


def read_arrays(
    npz_path: Path, order: Sequence[str], paths: Sequence[str], *, max_bytes: int | None
) -> dict[str, np.ndarray]:
    """The named variables of a checkpoint npz whose member `v{i}` holds variable `order[i]`.

    Before anything is inflated the npz must hold exactly `len(order)` plain numeric arrays
    declaring at most `max_bytes` in total (CheckpointRefused otherwise); then only the
    wanted members are read. Paths not in `order` are left out of the answer.
    """
    members = _members_in_order(npz_path, order, max_bytes)
    index = {path: i for i, path in enumerate(order)}
    wanted = [p for p in dict.fromkeys(paths) if p in index]
    names = [f"v{index[p]}" for p in wanted]
    by_name = dict(iter_arrays(npz_path, members, names))
    return {p: by_name[f"v{index[p]}"] for p in wanted}


def _members_in_order(
    npz_path: Path, order: Sequence[str], max_bytes: int | None
) -> dict[str, Member]:
    members = inspect_npz(npz_path, max_members=len(order), max_bytes=max_bytes)
    expected = {f"v{i}" for i in range(len(order))}
    if set(members) != expected:
        raise CheckpointRefused(
            f"{Path(npz_path).name}: holds arrays {sorted(members)[:5]}..., not the "
            f"{len(order)} variables v0..v{len(order) - 1} of the run's model"
        )
    return members


def fingerprint_checkpoint(
    npz_path: Path,
    order: Sequence[str],
    *,
    max_bytes: int | None,
    algorithm: str = DEFAULT_ALGORITHM,
) -> StateFingerprint:
    """The fingerprint of a checkpoint's state, computed as the job computes it in training.

    `order` names the variable in each member `v{i}` (the job saves and fingerprints the
    same ordered training state, so the final trace point's variable paths give it).
    Members are read one at a time; the bounds are those of `read_arrays`.
    """
    members = _members_in_order(npz_path, order, max_bytes)
    names = [f"v{i}" for i in range(len(order))]
    arrays = (array for _, array in iter_arrays(npz_path, members, names))
    return fingerprint_arrays(zip(order, arrays, strict=True), algorithm)
