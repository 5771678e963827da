"""Epoch-boundary checkpoints of the full training state, written atomically.

A checkpoint is `epoch-NNNNNN.npz` (the arrays) plus `epoch-NNNNNN.json` (manifest,
metadata and the npz's SHA-256). The JSON is written last, so a checkpoint without it
is incomplete and ignored; one whose npz digest does not match is corrupt and skipped.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from worker.errors import CheckpointError

_NAME = re.compile(r"^epoch-(\d{6})\.json$")


@dataclass(frozen=True)
class Checkpoint:
    """A loaded checkpoint: the state after `epoch` epochs and `step` steps."""

    path: Path
    epoch: int
    step: int
    meta: dict[str, Any]
    manifest: list[dict[str, Any]]
    arrays: list[np.ndarray]


def _fsync_write(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def _sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def save_checkpoint(
    directory: Path,
    *,
    epoch: int,
    step: int,
    state: Sequence[tuple[str, Any]],
    meta: dict[str, Any],
) -> Path:
    """Write the variables of `state` ((path, variable) pairs) and `meta`; returns the JSON path."""
    directory.mkdir(parents=True, exist_ok=True)
    stem = f"epoch-{epoch:06d}"
    arrays = {f"v{i}": np.asarray(var.numpy()) for i, (_, var) in enumerate(state)}
    manifest = [
        {"path": path, "dtype": arrays[f"v{i}"].dtype.name, "shape": list(arrays[f"v{i}"].shape)}
        for i, (path, _) in enumerate(state)
    ]
    npz_path = directory / f"{stem}.npz"
    tmp = directory / f".{stem}.npz.tmp"
    with open(tmp, "wb") as fh:
        np.savez(fh, **arrays)  # type: ignore[arg-type]
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, npz_path)
    doc = {
        "format": 1,
        "epoch": epoch,
        "step": step,
        "arrays": npz_path.name,
        "arrays_sha256": _sha256_file(npz_path),
        "manifest": manifest,
        "meta": meta,
    }
    json_path = directory / f"{stem}.json"
    _fsync_write(json_path, json.dumps(doc, indent=1).encode())
    return json_path


def list_checkpoints(directory: Path) -> list[Path]:
    """Checkpoint JSON files in the directory, oldest epoch first."""
    if not directory.is_dir():
        return []
    return sorted(p for p in directory.iterdir() if _NAME.match(p.name))


def load_checkpoint(json_path: Path) -> Checkpoint:
    """Read and verify one checkpoint; CheckpointError if it is incomplete or corrupt."""
    try:
        doc = json.loads(json_path.read_text())
        npz_path = json_path.with_name(doc["arrays"])
        if _sha256_file(npz_path) != doc["arrays_sha256"]:
            raise CheckpointError(f"{npz_path.name}: contents do not match the recorded digest")
        with np.load(npz_path, allow_pickle=False) as npz:
            arrays = [npz[f"v{i}"] for i in range(len(doc["manifest"]))]
        return Checkpoint(
            json_path, int(doc["epoch"]), int(doc["step"]), doc["meta"], doc["manifest"], arrays
        )
    except CheckpointError:
        raise
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise CheckpointError(f"{json_path.name}: unreadable checkpoint ({exc})") from exc


def load_latest(directory: Path, *, spec_hash: str) -> tuple[Checkpoint | None, list[str]]:
    """The newest intact checkpoint of this experiment, and warnings about skipped ones."""
    warnings: list[str] = []
    for json_path in reversed(list_checkpoints(directory)):
        try:
            ckpt = load_checkpoint(json_path)
        except CheckpointError as exc:
            warnings.append(f"skipped checkpoint: {exc}")
            continue
        if ckpt.meta.get("spec_hash") != spec_hash:
            warnings.append(f"skipped checkpoint {json_path.name}: it belongs to another spec")
            continue
        return ckpt, warnings
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


def checkpoint_epoch(name: str) -> int | None:
    """The epoch of a checkpoint file name (`epoch-000003.json` or `.npz`), else None."""
    match = re.match(r"^epoch-(\d{6})\.(?:json|npz)$", Path(name).name)
    return int(match.group(1)) if match else None


def read_variables(
    json_path: Path, paths: Sequence[str], *, npz_path: Path | None = None, verify: bool = True
) -> dict[str, np.ndarray]:
    """Only the named variables of one checkpoint (NumPy reads npz members lazily).

    `npz_path` overrides where the arrays are (a content-addressed store renames them);
    `verify` checks the npz against the digest in the JSON first. CheckpointError if the
    checkpoint is unreadable or does not match its digest.
    """
    try:
        doc = json.loads(Path(json_path).read_text())
        arrays_path = Path(npz_path) if npz_path is not None else json_path.with_name(doc["arrays"])
        if verify and _sha256_file(arrays_path) != doc["arrays_sha256"]:
            raise CheckpointError(f"{arrays_path.name}: contents do not match the recorded digest")
        index = {m["path"]: i for i, m in enumerate(doc["manifest"])}
        wanted = [p for p in paths if p in index]
        with np.load(arrays_path, allow_pickle=False) as npz:
            return {p: npz[f"v{index[p]}"] for p in wanted}
    except CheckpointError:
        raise
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise CheckpointError(f"{Path(json_path).name}: unreadable checkpoint ({exc})") from exc
