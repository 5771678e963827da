"""The runs page (`/`): every run with its verdict, filters in the URL, keyset paging,
live rows, and the export of the filtered set."""

from __future__ import annotations

import csv
import io
import itertools
import json
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Annotated, Any, Literal
from urllib.parse import urlencode

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import HTMLResponse, StreamingResponse
from sqlalchemy.orm import Session

from service.api.deps import ReadSessionDep
from service.dashboard import metric_sort, param_columns, run_rows
from service.dashboard.run_rows import VERDICT_FILTERS, Filters
from service.dashboard.web import SECURITY_HEADERS, PageRoute, ViewerDep, render
from service.errors import MalformedBody
from service.persistence.models import RUN_STATUSES
from service.runs.params import NAME_CHARS
from service.schemas import MAX_ID

router = APIRouter(route_class=PageRoute)

Cursor = Annotated[int | None, Query(ge=1, le=MAX_ID)]
# An empty field of the filter form means "any"; so every filter accepts "".
Digest = Annotated[str, Query(max_length=100, pattern=r"^[A-Za-z0-9:]*$")]
Text = Annotated[str, Query(max_length=200)]
StatusChoice = Literal["", "queued", "running", "succeeded", "failed", "cancelled"]
VerdictChoice = Literal["", "identical", "diverged", "incomparable", "reference", "pending"]
SPOT_CHECK_FILTERS = (
    "verified", "self-consistent", "failed", "pending", "no-other-worker", "error", "none"
)  # fmt: skip
SpotCheckChoice = Literal[
    "", "verified", "self-consistent", "failed", "pending", "no-other-worker", "error", "none"
]
PAGE_SIZES = (25, 50, 100, 200)
EXPORT_BATCH = 200  # runs whose metric and parameter cells one query reads
MAX_LIVE = 200  # rows one poll refreshes: at most a page's worth
# A page polls every 2 s for at most this many times (30 minutes), then asks for a reload.
MAX_POLLS = 900
PollCount = Annotated[int, Query(ge=0, le=MAX_POLLS)]
EXPORT_FIELDS = [
    "id", "status", "kind", "experiment_id", "experiment", "seed", "spec_hash", "worker",
    "image", "created_at", "started_at", "finished_at", "final_fingerprint", "rerun_of_id",
    "family_id", "verdict", "verdict_label", "name", "tags",
]  # fmt: skip


def get_filters(
    status: StatusChoice = "",
    verdict: VerdictChoice = "",
    experiment: Text = "",
    worker: Text = "",
    kind: Literal["train", "refine", "spot-check"] = "train",
    spec: Digest = "",
    fingerprint: Digest = "",
    spot_check: SpotCheckChoice = "",
    tag: Annotated[str, Query(max_length=64)] = "",
    search: Annotated[str, Query(max_length=2000)] = "",
    archived: Literal["", "only", "all"] = "",
) -> Filters:
    """The filters of the runs page, from its URL."""
    return Filters(
        status=status or None,
        verdict=verdict or None,
        experiment=experiment.strip() or None,
        worker=worker.strip() or None,
        kind=kind,
        spec=spec or None,
        fingerprint=fingerprint or None,
        spot_check=spot_check or None,
        tag=tag.strip() or None,
        search=search.strip() or None,
        archived=archived or None,
    )


FiltersDep = Annotated[Filters, Depends(get_filters)]
Limit = Annotated[int, Query(ge=1, le=200)]
MetricName = Annotated[str, Query(max_length=metric_sort.NAME_CHARS)]
PageKey = Annotated[str | None, Query(max_length=metric_sort.KEY_CHARS)]
SHOWN_METRICS = ("loss", "eval_accuracy")  # columns every runs page has


@dataclass(frozen=True)
class Columns:
    """The metric columns of the page and the one it is sorted by, if any (in its URL)."""

    metric: str = ""  # a metric the viewer picked, shown after the usual ones
    sort: str = ""  # "" for newest first
    order: str = "desc"
    params: tuple[str, ...] = ()  # parameter columns, in order

    @property
    def names(self) -> list[str]:
        names = list(SHOWN_METRICS)
        names += [n for n in (self.metric, self.sort) if n and n not in names]
        return list(dict.fromkeys(names))

    def query_items(self) -> list[tuple[str, str]]:
        items = [("metric", self.metric), ("sort", self.sort)]
        items += [("order", self.order)] if self.sort and self.order != "desc" else []
        items += [("param", name) for name in self.params]
        return [(k, v) for k, v in items if v]


def get_columns(
    metric: MetricName = "",
    sort: MetricName = "",
    order: Literal["asc", "desc"] = "desc",
    param: Annotated[list[str] | None, Query()] = None,
) -> Columns:
    """The metric and parameter columns and the sort of the runs page, from its URL."""
    picked = list(dict.fromkeys(p.strip() for p in param or () if p.strip()))
    if len(picked) > param_columns.MAX_PICKED or any(len(p) > NAME_CHARS for p in picked):
        raise MalformedBody(
            f"at most {param_columns.MAX_PICKED} parameter columns (param), "
            f"each a spec path of at most {NAME_CHARS} characters"
        )
    return Columns(metric=metric.strip(), sort=sort.strip(), order=order, params=tuple(picked))


ColumnsDep = Annotated[Columns, Depends(get_columns)]


def _live_url(ids: str, columns: Columns, *, n: int | None = None) -> str:
    # The live rows carry the page's metric cells, so the poll names every column the
    # page's URL does (a sort by a metric adds one).
    items = [("ids", ids), *([("n", str(n))] if n is not None else []), *columns.query_items()]
    return "/runs/live?" + urlencode(items, safe=",")


def _url(filters: Filters, columns: Columns | None = None, **more: object) -> str:
    items = filters.query_items() + (columns.query_items() if columns else [])
    items += [(k, str(v)) for k, v in more.items() if v is not None]
    return "/?" + urlencode(items) if items else "/"


@router.get("/", response_class=HTMLResponse)
def runs(
    request: Request,
    viewer: ViewerDep,
    db: ReadSessionDep,
    filters: FiltersDep,
    columns: ColumnsDep,
    before: Cursor = None,
    after: Cursor = None,
    cursor: PageKey = None,
    back: PageKey = None,
    limit: Limit = 50,
) -> HTMLResponse:
    """The runs, newest first or by a metric, with their verdicts and final metrics."""
    size = {"limit": limit} if limit != 50 else {}
    found: run_rows.RunsPage | metric_sort.SortedPage
    newer: dict[str, object] | None
    older: dict[str, object] | None
    if columns.sort:
        by_metric = _sorted_page(db, filters, columns, limit=limit, cursor=cursor, back=back)
        newer = {"back": by_metric.newer.text()} if by_metric.newer else None
        older = {"cursor": by_metric.older.text()} if by_metric.older else None
        found, deep = by_metric, cursor is not None or back is not None
    else:
        found = run_rows.page(db, filters, limit=limit, before=before, after=after)
        newer = {"after": found.newer} if found.newer else None
        older = {"before": found.older} if found.older else None
        deep = before is not None or after is not None
    ids = [r.run.id for r in found.rows]
    experiments = [r.experiment.id for r in found.rows]
    params = param_columns.values_by_experiment(db, experiments)
    picked = columns.params
    # The pager and sort links keep what the URL asked; the rows, polls and export show more.
    shown = replace(columns, params=tuple(param_columns.shown(picked, params, experiments)))
    live = ",".join(str(r.run.id) for r in found.rows if r.live)
    return render(
        request,
        "runs.html",
        viewer,
        page=found,
        filters=filters,
        columns=shown,
        values=metric_sort.values_of(db, ids, columns.names),
        params=params,
        picked=picked,
        param_label=param_columns.label,
        metric_names=metric_sort.metric_names(db),
        param_names=param_columns.names(db),
        sort_url=lambda name, order: _url(filters, replace(columns, sort=name, order=order)),
        unpick_url=lambda name: _url(
            filters, replace(columns, params=tuple(p for p in picked if p != name))
        ),
        statuses=RUN_STATUSES,
        verdicts=VERDICT_FILTERS,
        spot_check_filters=SPOT_CHECK_FILTERS,
        live_url=_live_url(live, shown) if live else None,
        newer_url=_url(filters, columns, **newer, **size) if newer else None,
        older_url=_url(filters, columns, **older, **size) if older else None,
        first_url=_url(filters, columns, **size) if deep else None,
        export_query=urlencode(filters.query_items() + shown.query_items()),
    )


def _sorted_page(
    db: Session,
    filters: Filters,
    columns: Columns,
    *,
    limit: int,
    cursor: str | None,
    back: str | None,
) -> metric_sort.SortedPage:
    sort = metric_sort.Sort(columns.sort, descending=columns.order == "desc")
    return metric_sort.page(
        db,
        filters,
        sort,
        limit=limit,
        cursor=metric_sort.Key.parse(cursor) if cursor is not None else None,
        back=metric_sort.Key.parse(back) if back is not None else None,
    )


def _ids(text: str) -> list[int]:
    try:
        ids = [int(part) for part in text.split(",") if part]
    except ValueError:
        raise MalformedBody("ids must be comma-separated run ids") from None
    if len(ids) > MAX_LIVE or any(not 1 <= i <= MAX_ID for i in ids):
        raise MalformedBody(f"at most {MAX_LIVE} run ids in [1, {MAX_ID}]")
    return ids


@router.get("/runs/live", response_class=HTMLResponse)
def live_rows(
    request: Request,
    viewer: ViewerDep,
    db: ReadSessionDep,
    columns: ColumnsDep,
    ids: Annotated[str, Query(max_length=2400)] = "",
    n: PollCount = 0,
) -> HTMLResponse:
    """The rows of the page that may still change (unfinished runs, and finished ones whose
    verdict an older run of their family still decides), swapped in place; polling stops
    once none may."""
    rows = run_rows.by_ids(db, _ids(ids))
    still = ",".join(str(r.run.id) for r in rows if r.live)
    return render(
        request,
        "runs_live.html",
        viewer,
        rows=rows,
        live_url=_live_url(still, columns, n=n + 1) if still else None,
        n=n + 1,
        max_polls=MAX_POLLS,
        columns=columns,
        values=metric_sort.values_of(db, [r.run.id for r in rows], columns.names),
        params=param_columns.values_by_experiment(db, [r.experiment.id for r in rows]),
    )


def _records(
    db: Session, rows: Iterator[run_rows.RunRow], columns: Columns
) -> Iterator[dict[str, Any]]:
    """The export's records: each run's fields, then its metric and parameter columns (a
    cell is empty where the run has no such value), a batch of runs at a time."""
    while batch := list(itertools.islice(rows, EXPORT_BATCH)):
        metrics = metric_sort.values_of(db, [r.run.id for r in batch], columns.names)
        params = param_columns.values_by_experiment(db, [r.experiment.id for r in batch])
        for r in batch:
            record = run_rows.export_record(r)
            mine, spec = metrics.get(r.run.id, {}), params.get(r.experiment.id, {})
            record.update({f"metrics.{n}": mine.get(n) for n in columns.names})
            record.update({f"params.{n}": spec.get(n) for n in columns.params})
            yield record


def _csv(records: Iterator[dict[str, Any]], fields: list[str]) -> Iterator[str]:
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=fields, lineterminator="\n")
    writer.writeheader()
    for i, record in enumerate(records):
        record["seed"] = " ".join(str(s) for s in record["seed"])
        record["tags"] = " ".join(record["tags"])
        writer.writerow(record)
        if i % 200 == 199:
            yield buffer.getvalue()
            buffer.seek(0)
            buffer.truncate()
    yield buffer.getvalue()


def _json(records: Iterator[dict[str, Any]]) -> Iterator[str]:
    yield "["
    for i, record in enumerate(records):
        yield ("," if i else "") + "\n" + json.dumps(record)
    yield "\n]\n"


@router.get("/runs/export.{fmt}")
def export(
    request: Request,
    viewer: ViewerDep,
    db: ReadSessionDep,
    filters: FiltersDep,
    columns: ColumnsDep,
    fmt: Literal["csv", "json"],
) -> StreamingResponse:
    """Every run of the filtered set with the page's metric and parameter columns (those
    in the URL), streamed as CSV or JSON a batch at a time."""
    db.close()  # the stream reads with its own session, in the thread pool

    def records() -> Iterator[dict[str, Any]]:
        with request.app.state.read_sessionmaker() as session:
            yield from _records(session, run_rows.iterate(session, filters), columns)

    fields = EXPORT_FIELDS + [f"metrics.{n}" for n in columns.names]
    fields += [f"params.{n}" for n in columns.params]
    body = _csv(records(), fields) if fmt == "csv" else _json(records())
    media = "text/csv; charset=utf-8" if fmt == "csv" else "application/json"
    headers = {
        **SECURITY_HEADERS,
        "Content-Disposition": f'attachment; filename="runs.{fmt}"',
    }
    return StreamingResponse(body, media_type=media, headers=headers)
