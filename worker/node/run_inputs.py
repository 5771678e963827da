"""What a claimed run needs before its job starts: its dataset, code bundle and model
definition, each fetched by digest and verified; and, when one cannot be had, the report
that says so (a release while the API is away, a failure when it never will be)."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any, Literal, NamedTuple

from worker.node.client import ApiClient, ApiError
from worker.node.dataset_cache import DatasetCache, DatasetTooLargeForMemory, job_memory
from worker.node.executors import Executor

_DIGEST = re.compile(r"sha256:([0-9a-f]{64})")


class RunInputs(NamedTuple):
    """The verified files a job reads (None: the spec names none)."""

    dataset_file: Path | None
    code_file: Path | None
    model_file: Path | None


class InputUnavailable(Exception):
    """An input could not be fetched: `kind` and `body` are the report to send instead."""

    def __init__(self, message: str, kind: Literal["fail", "release"], **body: Any) -> None:
        super().__init__(message)
        self.kind: Literal["fail", "release"] = kind
        self.body = body


def fetch_inputs(
    spec: dict[str, Any],
    *,
    client: ApiClient,
    executor: Executor,
    work_dir: Path,
    attempt_dir: Path,
) -> RunInputs:
    """The run's inputs, fetched; InputUnavailable with the report to send if one is not."""
    try:
        dataset = _fetch_dataset(spec, client, executor, work_dir)
    except (ApiError, OSError, ValueError) as exc:
        raise _dataset_unavailable(exc) from exc
    try:
        code = _fetch_stored(spec.get("code"), client, attempt_dir, kind="code")
    except (ApiError, OSError, ValueError) as exc:
        raise _unavailable(exc, "code bundle", "CodeBundleUnavailable", "the bundle") from exc
    try:
        definition = (spec.get("model") or {}).get("definition")
        model = _fetch_stored(definition, client, attempt_dir, kind="model")
    except (ApiError, OSError, ValueError) as exc:
        what = "model definition"
        raise _unavailable(exc, what, "ModelDefinitionUnavailable", f"the {what}") from exc
    return RunInputs(dataset, code, model)


def _fetch_dataset(
    spec: dict[str, Any], client: ApiClient, executor: Executor, work_dir: Path
) -> Path | None:
    """The run's dataset from the node's cache (fetched once, verified before each use)."""
    digest = (spec.get("dataset") or {}).get("data")
    if digest is None:
        return None
    memory = job_memory(getattr(executor, "memory", None))
    return DatasetCache(work_dir / "datasets", client, memory=memory).fetch(str(digest))


def _fetch_stored(
    digest: object, client: ApiClient, attempt_dir: Path, *, kind: Literal["code", "model"]
) -> Path | None:
    """A code bundle or model definition, downloaded into the workspace, verified by digest."""
    if digest is None:
        return None
    match = _DIGEST.fullmatch(str(digest))
    if match is None:  # the digest becomes a file name
        what = "code bundle" if kind == "code" else "model definition"
        raise ValueError(f"not a {what} digest: {digest!r}")
    if kind == "code":
        path = attempt_dir / "code" / f"{match.group(1)}.whl"
        path.parent.mkdir(parents=True, exist_ok=True)
        client.download_code_bundle(str(digest), path)
    else:
        path = attempt_dir / "model-definition" / match.group(1)
        path.parent.mkdir(parents=True, exist_ok=True)
        client.download_model_definition(str(digest), path)
    os.chmod(path, 0o444)  # what the job installs or loads is what was verified
    return path


def _unavailable(exc: Exception, what: str, error_type: str, fetched: str) -> InputUnavailable:
    message = f"{what} unavailable: {exc}"
    if isinstance(exc, ApiError) and exc.retryable:  # the API is away or busy for now
        return InputUnavailable(message, "release", reason=f"{what} not available now ({exc})")
    error = {"type": error_type, "message": f"cannot fetch {fetched}: {exc}"}
    return InputUnavailable(message, "fail", error=error)


def _dataset_unavailable(exc: Exception) -> InputUnavailable:
    if isinstance(exc, DatasetTooLargeForMemory):  # before the job, not an OOM kill in it
        error = {"type": "DatasetTooLarge", "message": str(exc)}
        return InputUnavailable(f"dataset unavailable: {exc}", "fail", error=error)
    return _unavailable(exc, "dataset", "DatasetUnavailable", "the dataset")
