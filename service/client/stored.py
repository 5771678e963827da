"""What the API stores by content digest: datasets, model definitions and code bundles
(`Client.datasets`, `Client.models`, `Client.code`). Each is pushed once and named in specs
by its `sha256:` digest."""

from __future__ import annotations

import hashlib
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar, Generic, TypeVar

from .http import Http
from .models import (
    ApiModel,
    CodeBundle,
    CodeBundlePage,
    Dataset,
    DatasetPage,
    ModelDefinition,
    ModelDefinitionPage,
)
from .wheel_build import build_wheel

PUSH_READ_SECONDS = 600.0  # a pushed file is checked whole before the answer
_CHUNK = 1 << 20
_PAGE = 500  # the server's largest page

Record = TypeVar("Record", bound=ApiModel)
RecordPage = TypeVar("RecordPage", bound=ApiModel)


class _Stored(Generic[Record, RecordPage]):
    """Push, page through, list and read one kind of stored file."""

    _path: ClassVar[str]
    _record: type[Any]
    _page: type[Any]

    def __init__(self, http: Http) -> None:
        self._http = http

    def _push(self, path: Path, params: dict[str, str]) -> Record:
        digest, size = _file_sha256(path)
        headers = {
            "Content-Type": "application/octet-stream",
            "Content-Length": str(size),
            "X-Content-SHA256": f"sha256:{digest}",
        }
        http = self._http
        response = http.send(  # content-addressed: the same bytes twice are stored once
            lambda: http.http.build_request(
                "POST",
                f"/api/v1{self._path}",
                params=params,
                headers=headers,
                content=_chunks(path),  # a fresh reader per attempt
                timeout=http.timeout(read=PUSH_READ_SECONDS),
            ),
            idempotent=True,
        )
        made: Record = self._record.from_api(response.json())
        return made

    def page(self, *, limit: int = 50, offset: int = 0, archived: str = "false") -> RecordPage:
        """One page, newest first, with the total count; archived ones with `archived`
        "true" (only them) or "any"."""
        params = {"limit": limit, "offset": offset, "archived": archived}
        made: RecordPage = self._page.from_api(self._http.json("GET", self._path, params=params))
        return made

    def list(self, *, limit: int | None = 50, archived: str = "false") -> list[Record]:
        """Newest first: up to `limit` (None: all)."""
        found: list[Record] = []
        while limit is None or len(found) < limit:
            want = _PAGE if limit is None else min(_PAGE, limit - len(found))
            page = self.page(limit=want, offset=len(found), archived=archived)
            items: list[Record] = page.items  # type: ignore[attr-defined]
            found += items
            if not items or len(found) >= page.total:  # type: ignore[attr-defined]
                break
        return found

    def get(self, digest: str) -> Record:
        """One record by digest (`sha256:<hex>` or the bare hex), with the runs that used it."""
        made: Record = self._record.from_api(self._http.json("GET", f"{self._path}/{digest}"))
        return made

    def archive(self, digest: str, *, archived: bool = True) -> Record:
        """Archive it (lists leave it out, new experiments may not name it, runs that used
        it rerun as before; retention later removes its bytes), or with `archived=False`
        bring it back."""
        action = "archive" if archived else "unarchive"
        answer = self._http.json("POST", f"{self._path}/{digest}/{action}")
        made: Record = self._record.from_api(answer)
        return made

    def delete(self, digest: str) -> None:
        """Delete it for good, record and bytes (admins); refused (409) while an experiment
        names it."""
        self._http.json("DELETE", f"{self._path}/{digest}")


class Datasets(_Stored[Dataset, DatasetPage]):
    """Datasets stored on the API by digest (`Client.datasets`)."""

    _path = "/datasets"
    _record = Dataset
    _page = DatasetPage

    def push(self, path: str | Path, *, name: str | None = None) -> Dataset:
        """Upload an .npz file (streamed, with its SHA-256); its digest goes in `dataset.data`."""
        path = Path(path)
        return self._push(path, {"name": name or path.name})


class Models(_Stored[ModelDefinition, ModelDefinitionPage]):
    """Keras model definitions stored on the API by digest (`Client.models`)."""

    _path = "/models"
    _record = ModelDefinition
    _page = ModelDefinitionPage

    def push(self, path: str | Path, *, name: str | None = None) -> ModelDefinition:
        """Upload a Keras JSON config (`model.to_json()`) or a `.keras` archive; its digest goes
        in `model.definition`. Only the architecture is used: an archive's weights are not."""
        path = Path(path)
        return self._push(path, {"name": name or path.name})


class CodeBundles(_Stored[CodeBundle, CodeBundlePage]):
    """Code bundles (wheels of your own components) stored on the API (`Client.code`)."""

    _path = "/code"
    _record = CodeBundle
    _page = CodeBundlePage

    def push(self, path: str | Path, *, name: str | None = None) -> CodeBundle:
        """Upload a wheel, or build one of a project directory first (offline, with the
        project's build backend: setuptools comes with this package); its digest goes in
        `code`. ValueError naming what is missing, or why, when the build fails."""
        path = Path(path)
        if not path.is_dir():
            if path.suffix != ".whl":
                raise ValueError(f"{path} is neither a project directory nor a .whl file")
            return self._push(path, {"name": name or path.name, "filename": path.name})
        with tempfile.TemporaryDirectory(prefix="repro-code-") as tmp:
            wheel = build_wheel(path, Path(tmp))
            return self._push(wheel, {"name": name or wheel.name, "filename": wheel.name})


def _file_sha256(path: Path) -> tuple[str, int]:
    digest = hashlib.sha256()
    size = 0
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(_CHUNK), b""):
            digest.update(block)
            size += len(block)
    return digest.hexdigest(), size


def _chunks(path: Path) -> Iterator[bytes]:
    # A generator opens the file only when httpx starts sending, once per attempt.
    with open(path, "rb") as fh:
        yield from iter(lambda: fh.read(_CHUNK), b"")
