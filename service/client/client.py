"""`Client`: the Reprotrain API from Python. Submit specs, wait for runs, rerun them and
read the verdict, push datasets, model definitions and code, list runs across pages,
compare runs."""

from __future__ import annotations

import contextlib
import os
import tempfile
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, Self

import httpx
from pydantic import Field, PrivateAttr

from .admin import Tokens, audit_log
from .errors import WaitTimeout
from .http import Http
from .local_token import admin_token_path, local_admin_token
from .models import (
    TERMINAL,
    Audit,
    AuditLogPage,
    CodeBundle,
    Comparison,
    Experiment,
    Refinement,
    RunLog,
    RunsComparison,
    RunState,
    SpotCheck,
)
from .script_bundle import build_script_wheel, script_entry
from .spec_file import submission_body
from .stored import CodeBundles, Datasets, Models

DEFAULT_URL = "http://127.0.0.1:8000"
_PAGE = 500  # the server's largest page

RunRef = int | RunState


def _id(run: RunRef) -> int:
    return run.id if isinstance(run, RunState) else int(run)


class _Unset:
    """A keyword argument not given (None is a value: it clears)."""

    def __repr__(self) -> str:
        return "UNSET"


UNSET = _Unset()


class Run(RunState):
    """A run, with what can be done to it: `wait`, `rerun`, `refresh`, `cancel`, `compare`,
    `compare_with`.

    `warnings` (from a submit) says what the spec does that its author may not expect.
    """

    warnings: list[str] = Field(default_factory=list)
    experiment: Experiment | None = None
    _client: Client | None = PrivateAttr(default=None)
    _submitted: dict[str, Any] | None = PrivateAttr(default=None)

    @property
    def submit_answer(self) -> dict[str, Any] | None:
        """The API's whole answer to the submit that created this run (None otherwise)."""
        return self._submitted

    def _api(self) -> Client:
        if self._client is None:
            raise RuntimeError("this run was not read through a Client")
        return self._client

    def refresh(self) -> Run:
        """The run as it is now, with its spec, seed, metrics and verdict report."""
        return self._api().run(self.id)

    def wait(
        self,
        timeout: float | None = None,
        *,
        on_progress: Callable[[Run], None] | None = None,
        poll: float = 0.5,
    ) -> Run:
        """The run once it has succeeded, failed or been cancelled; WaitTimeout after
        `timeout` s. `on_progress` gets the run each time its status or progress changes."""
        return self._api().wait(self.id, timeout=timeout, on_progress=on_progress, poll=poll)

    def rerun(self) -> Run:
        """Queue a rerun (same spec, same seed); `wait()` on it gives its verdict."""
        return self._api().rerun(self.id)

    def cancel(self) -> Run:
        """Cancel the run if it is queued or running."""
        return self._api().cancel(self.id)

    def edit(self, **changes: Any) -> Run:
        """Change the run's name, notes or tags (see `Client.edit_run`)."""
        return self._api().edit_run(self.id, **changes)

    def compare(self, other: RunRef) -> Comparison:
        """This run compared with another: verdict, first divergence, environment diff."""
        return self._api().compare(self.id, other)

    def compare_with(self, *others: RunRef) -> RunsComparison:
        """This run and the others compared at once, pair by pair (see `Client.compare_runs`)."""
        return self._api().compare_runs([self.id, *others])


class RunPage:
    """One page of runs and the cursor of the next (None on the last page)."""

    def __init__(self, items: list[Run], next_cursor: str | None) -> None:
        self.items = items
        self.next_cursor = next_cursor


class Client:
    """The Reprotrain API. `url` defaults to REPRO_API_URL, `token` to REPRO_TOKEN, else,
    for an API on this machine, to the admin token `repro serve` keeps (as the CLI does).

    Every request times out after `timeout` s. Reads, and submits (each carries an
    idempotency key), are retried at most `retries` times on 429, 502, 503 and 504, waiting
    what the server's Retry-After asks, up to `max_retry_wait` s.
    """

    def __init__(
        self,
        url: str | None = None,
        token: str | None = None,
        *,
        timeout: float = 30.0,
        retries: int = 3,
        backoff: float = 0.25,
        max_retry_wait: float = 60.0,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.url = url or os.environ.get("REPRO_API_URL") or DEFAULT_URL
        origin = "the token argument" if token else None
        if not token and os.environ.get("REPRO_TOKEN"):
            token, origin = os.environ["REPRO_TOKEN"], "REPRO_TOKEN"
        if not token:
            token = local_admin_token(self.url)
            origin = f"the local admin token file {admin_token_path()}"
        self._http = Http(
            self.url,
            token,
            token_origin=origin,
            timeout=timeout,
            retries=retries,
            backoff=backoff,
            max_retry_wait=max_retry_wait,
            transport=transport,
        )
        self.datasets = Datasets(self._http)
        self.models = Models(self._http)
        self.code = CodeBundles(self._http)
        self.tokens = Tokens(self._http)

    def close(self) -> None:
        """Close the connection pool."""
        self._http.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def _run(self, data: dict[str, Any], **extra: Any) -> Run:
        run = Run.model_validate({**data, **extra})
        run._raw = data
        run._client = self
        return run

    def submit(
        self,
        spec: str | Path | Mapping[str, Any],
        *,
        copies: int | None = None,
        idempotency_key: str | None = None,
        priority: int = 0,
    ) -> Run:
        """Submit a spec (a YAML or JSON file's path, or a mapping) and return its first run.

        With `copies` > 1 the copies run at once on different workers (see `audit`). A
        `priority` above 0 goes before other submitters' runs (admin tokens only).
        """
        body, content_type = submission_body(spec)
        # A retried submit (the answer was lost) must not create a second experiment.
        key = idempotency_key or uuid.uuid4().hex
        headers = {"Content-Type": content_type, "Idempotency-Key": key}
        params = {"copies": copies} if copies is not None and copies > 1 else {}
        if priority:
            params["priority"] = priority
        answer = self._http.json(
            "POST", "/experiments", idempotent=True, content=body, headers=headers, params=params
        )
        return self._submitted(answer)

    def _submitted(self, answer: dict[str, Any]) -> Run:
        """The run a submission answered with, with its experiment's spec, hash and seed."""
        experiment = answer["experiment"]
        run = self._run(
            answer["run"],
            experiment=experiment,
            spec=experiment.get("spec"),
            spec_hash=experiment.get("spec_hash"),
            seed=experiment.get("seed"),
            warnings=answer.get("warnings") or [],
            audit_id=answer.get("audit_id"),
        )
        run._submitted = answer
        return run

    def submit_script(
        self,
        script: str | Path,
        args: Sequence[str] = (),
        *,
        directory: str | Path | None = None,
        name: str | None = None,
        seed: int | Sequence[int] | None = None,
        image: str | None = None,
        priority: int = 0,
    ) -> Run:
        """Run your own training script on a worker: its directory (or `directory`, which
        holds it) is pushed by content digest, and the script runs there with `args` as
        `python SCRIPT ARGS`, with `reprotrain.init()` attached to the run. Workers that
        run code take it (Docker's sandbox, or `--trust-code`); reruns verify like any run.
        ScriptDirectoryError when the directory cannot be shipped."""
        base, entry = script_entry(Path(script), Path(directory) if directory else None)
        with tempfile.TemporaryDirectory(prefix="repro-script-") as tmp:
            wheel = build_script_wheel(base, entry, Path(tmp))
            bundle = self.code.push(wheel, name=f"{base.name}/{entry}")
        spec: dict[str, Any] = {
            "kind": "script",
            "name": name or Path(entry).stem,
            "script": {"entry": entry, "args": [str(a) for a in args]},
            "code": bundle.digest,
        }
        if seed is not None:
            spec["seed"] = seed if isinstance(seed, int) else list(seed)
        if image is not None:
            spec["environment"] = {"image": image}
        return self.submit(spec, priority=priority)

    def run(self, run_id: RunRef) -> Run:
        """One run, with its spec, seed, metrics, progress and verdict report."""
        return self._run(self._http.json("GET", f"/runs/{_id(run_id)}"))

    def runs_page(
        self,
        *,
        status: str | None = None,
        experiment_id: int | None = None,
        verdict: str | None = None,
        tag: str | None = None,
        search: str | None = None,
        archived: str | None = None,
        limit: int = 50,
        cursor: str | None = None,
    ) -> RunPage:
        """One page of runs, newest first; pass its `next_cursor` back for the next.
        `search`: `params.PATH = 0.003 and metrics.accuracy > 0.9` (see the README)."""
        filters = {
            "status": status,
            "experiment_id": experiment_id,
            "verdict": verdict,
            "tag": tag,
            "search": search,
            "archived": archived,  # "true": only archived runs; "any": both; default: none
        }
        params: dict[str, Any] = {k: v for k, v in filters.items() if v is not None}
        params["limit"] = limit
        if cursor is not None:
            params["cursor"] = cursor
        page = self._http.json("GET", "/runs", params=params)
        return RunPage([self._run(r) for r in page.get("items") or []], page.get("next_cursor"))

    def runs(
        self,
        *,
        status: str | None = None,
        experiment_id: int | None = None,
        verdict: str | None = None,
        tag: str | None = None,
        search: str | None = None,
        archived: str | None = None,
        limit: int | None = None,
        page_size: int = 100,
    ) -> Iterator[Run]:
        """Runs, newest first, read a page at a time by cursor: up to `limit` (None: all)."""
        cursor: str | None = None
        seen = 0
        while limit is None or seen < limit:
            want = page_size if limit is None else min(page_size, limit - seen)
            page = self.runs_page(
                status=status,
                experiment_id=experiment_id,
                verdict=verdict,
                tag=tag,
                search=search,
                archived=archived,
                limit=want,
                cursor=cursor,
            )
            yield from page.items
            seen += len(page.items)
            cursor = page.next_cursor
            if cursor is None or not page.items:
                return

    def rerun(
        self,
        run_id: RunRef,
        *,
        priority: int = 0,
        on_worker: bool = False,
        hardware: str | None = None,
    ) -> Run:
        """Queue a rerun of a run (same spec, same seed, on the hardware class it trained
        on); returns the new run. A `priority` above 0 goes before other submitters' runs
        (admin tokens only). A run recorded by hand (`python train.py` with the service
        configured) is retrained on a worker only with `on_worker`. `hardware` sends it to
        another class (or leading part: "gpu"), or "any"; its comparison reports that."""
        params: dict[str, Any] = {"priority": priority} if priority else {}
        if on_worker:
            params["on_worker"] = "true"
        if hardware is not None:
            params["hardware"] = hardware
        return self._run(
            self._http.json("POST", f"/runs/{_id(run_id)}/rerun", params=params or None)
        )

    def record_script_run(
        self,
        script: str | Path,
        args: Sequence[str],
        *,
        name: str,
        seed: Sequence[int],
    ) -> tuple[Run, CodeBundle]:
        """Record a run of a script its user runs by hand (what `reprotrain.init()` does
        with the service configured): the script's directory is pushed by digest and the
        experiment and its run recorded, running from now; no worker claims it. Returns
        the run (with its resolved spec) and the directory's bundle."""
        base, entry = script_entry(Path(script))
        with tempfile.TemporaryDirectory(prefix="repro-script-") as tmp:
            wheel = build_script_wheel(base, entry, Path(tmp))
            bundle = self.code.push(wheel, name=f"{base.name}/{entry}")
        spec = {
            "kind": "script",
            "name": name,
            "script": {"entry": entry, "args": [str(a) for a in args]},
            "code": bundle.digest,
            "seed": [int(s) for s in seed],
        }
        answer = self._http.json("POST", "/experiments/by-hand", json=spec)
        return self._submitted(answer), bundle

    def report_result(self, run_id: RunRef, result: Mapping[str, Any]) -> Run:
        """Report the result document of a run recorded by hand (`record_script_run`); a
        repeated report is answered with the run as recorded."""
        path = f"/runs/{_id(run_id)}/result"
        return self._run(self._http.json("POST", path, idempotent=True, json=dict(result)))

    def edit_run(
        self,
        run_id: RunRef,
        *,
        name: str | _Unset | None = UNSET,
        notes: str | _Unset | None = UNSET,
        tags: Sequence[str] | _Unset | None = UNSET,
        add_tags: Sequence[str] = (),
        remove_tags: Sequence[str] = (),
    ) -> Run:
        """Name a run, write its notes, set its tags (all of them) or add and remove some;
        what is not given stays as it is, None or "" clears. Returns the run as it now is."""
        body: dict[str, Any] = {}
        for key, value in (("name", name), ("notes", notes), ("tags", tags)):
            if not isinstance(value, _Unset):
                body[key] = list(value) if key == "tags" and value is not None else value
        if add_tags:
            body["add_tags"] = list(add_tags)
        if remove_tags:
            body["remove_tags"] = list(remove_tags)
        return self._run(self._http.json("PATCH", f"/runs/{_id(run_id)}", json=body))

    def archive_run(self, run_id: RunRef, *, archived: bool = True) -> Run:
        """Archive an ended run (lists leave it out unless asked), or with `archived=False`
        bring it back; nothing of it is removed."""
        action = "archive" if archived else "unarchive"
        return self._run(self._http.json("POST", f"/runs/{_id(run_id)}/{action}"))

    def cancel(self, run_id: RunRef) -> Run:
        """Cancel a queued or running run."""
        return self._run(self._http.json("POST", f"/runs/{_id(run_id)}/cancel"))

    def delete_run(self, run_id: RunRef) -> None:
        """Delete an ended run for good (admins); refused (409) while its reruns, verdicts
        against it, refinements or spot checks refer to it."""
        self._http.json("DELETE", f"/runs/{_id(run_id)}")

    def log(self, run_id: RunRef, *, attempt: int | None = None, after: int = 0) -> RunLog:
        """The run's job log (the latest attempt unless named) from byte `after`."""
        params: dict[str, Any] = {"after": after}
        if attempt is not None:
            params["attempt"] = attempt
        return RunLog.from_api(self._http.json("GET", f"/runs/{_id(run_id)}/log", params=params))

    def follow_log(
        self, run_id: RunRef, *, poll: float = 2.0, timeout: float | None = None
    ) -> Iterator[str]:
        """The job's log as it comes: what is there, then each new piece, until the run has
        ended and its last lines are in (WaitTimeout after `timeout` seconds)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        after, attempt = 0, None
        while True:
            piece = self.log(run_id, after=after)
            if attempt is not None and piece.attempt != attempt and piece.attempt is not None:
                # A new attempt (the run was taken back and claimed again): its log from 0.
                yield f"[attempt {piece.attempt} of the run]\n"
                piece = self.log(run_id, attempt=piece.attempt)
            if piece.dropped:
                yield f"[{piece.dropped} bytes of the log are no longer kept]\n"
            if piece.text:
                yield piece.text
            after, attempt = piece.end, piece.attempt
            if not piece.running:
                return
            if deadline is not None and time.monotonic() > deadline:
                raise WaitTimeout(f"run {_id(run_id)} still running after {timeout} s")
            time.sleep(poll)

    def experiment(self, experiment_id: int) -> Experiment:
        """One experiment: its spec, spec hash and resolved seed."""
        return Experiment.from_api(self._http.json("GET", f"/experiments/{experiment_id}"))

    def archive_experiment(self, experiment_id: int, *, archived: bool = True) -> Experiment:
        """Archive an experiment with its runs (refused while one has not ended), or with
        `archived=False` bring it back with the runs archived with it."""
        action = "archive" if archived else "unarchive"
        path = f"/experiments/{experiment_id}/{action}"
        return Experiment.from_api(self._http.json("POST", path))

    def delete_experiment(self, experiment_id: int) -> None:
        """Delete an experiment for good (admins); refused (409) while it has runs."""
        self._http.json("DELETE", f"/experiments/{experiment_id}")

    def compare(self, a: RunRef, b: RunRef) -> Comparison:
        """Run b compared with run a: the verdict, why, and where they first diverge."""
        params = {"a": _id(a), "b": _id(b)}
        return Comparison.from_api(self._http.json("GET", "/compare", params=params))

    def compare_runs(self, runs: Iterable[RunRef]) -> RunsComparison:
        """Two or more runs at once: each pair's verdict, the spec and environment fields that
        differ among them, their metric curves (the server caps how many runs)."""
        params = {"runs": ",".join(str(_id(r)) for r in runs)}
        return RunsComparison.from_api(self._http.json("GET", "/compare/runs", params=params))

    def refine(self, a: RunRef, b: RunRef) -> Refinement:
        """Queue a per-step re-trace of two diverged runs' divergent epoch."""
        body = {"a": _id(a), "b": _id(b)}
        return Refinement.from_api(self._http.json("POST", "/compare/refine", json=body))

    def refinement(self, refinement_id: int) -> Refinement:
        """A refinement: its runs' status and, once both finished, its report."""
        return Refinement.from_api(self._http.json("GET", f"/compare/refine/{refinement_id}"))

    def spot_check(
        self,
        run_id: RunRef,
        *,
        segments: int = 3,
        seed: int | None = None,
        allow_trainer: bool = False,
    ) -> SpotCheck:
        """Queue replays of `segments` random segments of a succeeded run (see SpotCheck), on
        workers of another token than the trainer's unless `allow_trainer`."""
        body: dict[str, Any] = {"segments": segments}
        if seed is not None:
            body["seed"] = seed
        if allow_trainer:
            body["allow_trainer"] = True
        path = f"/runs/{_id(run_id)}/spot-checks"
        return SpotCheck.from_api(self._http.json("POST", path, json=body))

    def spot_check_status(self, check_id: int) -> SpotCheck:
        """A spot check: its segments' replays and, once all ended, its report."""
        return SpotCheck.from_api(self._http.json("GET", f"/spot-checks/{check_id}"))

    def wait_spot_check(
        self,
        check_id: int,
        *,
        timeout: float | None = None,
        poll: float = 1.0,
        on_progress: Callable[[SpotCheck], None] | None = None,
    ) -> SpotCheck:
        """The spot check once all its replays have ended; WaitTimeout after `timeout` s.
        `on_progress` gets it at every poll (its `waiting_reason` says why replays wait)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while not (found := self.spot_check_status(check_id)).ended:
            if on_progress is not None:
                on_progress(found)
            if deadline is not None and time.monotonic() >= deadline:
                raise WaitTimeout(f"spot check {check_id} still pending after {timeout} s")
            time.sleep(poll)
        return found

    def audit(self, audit_id: int) -> Audit:
        """A reproducibility audit: its copies and whether they all agree."""
        return Audit.from_api(self._http.json("GET", f"/repro-audits/{audit_id}"))

    def collect_archived(
        self, *, dry_run: bool = False, retention_days: float | None = None
    ) -> dict[str, Any]:
        """Remove the files of runs, and the bytes of datasets, definitions and bundles,
        archived longer than the retention (admins); with `dry_run`, only say which. The
        answer of `POST /admin/collect`."""
        params: dict[str, Any] = {"dry_run": dry_run}
        if retention_days is not None:
            params["retention_days"] = retention_days
        answer: dict[str, Any] = self._http.json("POST", "/admin/collect", params=params)
        return answer

    def audit_log(self, *, action: str | None = None, limit: int = 100) -> AuditLogPage:
        """Who submitted, reran, cancelled or created tokens, newest first (admins)."""
        return audit_log(self._http, action=action, limit=limit)

    def wait(
        self,
        run_id: RunRef,
        *,
        timeout: float | None = None,
        on_progress: Callable[[Run], None] | None = None,
        poll: float = 0.5,
    ) -> Run:
        """The run once it has ended; WaitTimeout after `timeout` s.

        Follows the run's event stream, so the end is seen as it happens; polls every
        `poll` s instead where the stream is not available or breaks off.
        """
        number = _id(run_id)
        deadline = None if timeout is None else time.monotonic() + timeout

        def ended(run: Run) -> bool:
            if on_progress is not None:
                on_progress(run)
            if run.status in TERMINAL:
                return True
            if deadline is not None and time.monotonic() >= deadline:
                raise WaitTimeout(f"run {number} still {run.status} after {timeout} s")
            return False

        read = None if deadline is None else max(deadline - time.monotonic(), 0.01)
        with (
            contextlib.suppress(httpx.HTTPError),
            self._http.lines(f"/runs/{number}/events", read=read) as lines,
        ):
            for line in lines or ():
                if line.startswith("data:") and ended(run := self.run(number)):
                    return run
        while True:
            if ended(run := self.run(number)):
                return run
            pause = poll if deadline is None else min(poll, deadline - time.monotonic())
            time.sleep(max(pause, 0.0))
