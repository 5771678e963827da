"""Prometheus metrics of the API: the queue and verdicts as the database has them, and what
this process measured (claim latency, lease expiries, request durations).

Counts that live in the database are read when scraped, with a few grouped queries on
indexed columns, so every API replica reports the same numbers and nothing drifts. Counts
that only this process sees are in-process counters and histograms (sum them over
replicas). Labels are bounded: statuses, outcomes, verdict kinds, route templates, and the
standard HTTP methods (any other is "other"), never anything a client makes up.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import timedelta
from http import HTTPStatus
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, ProcessCollector
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker
from starlette.routing import Mount
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.config import Settings
from service.persistence.models import (
    TERMINAL_STATUSES,
    GangMember,
    Run,
    SpotCheck,
    Verdict,
    Worker,
    utcnow,
)
from service.verification.spot_check_reports import OUTCOMES as SPOT_CHECK_OUTCOMES

# Process-wide: registered into each app's registry (an app is made once per process,
# tests make several).
CLAIM_SECONDS = Histogram(
    "reprotrain_claim_seconds",
    "Time from a worker's claim to its answer, by outcome (claimed, or nothing to run)",
    ["outcome"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 30),
    registry=None,
)
LEASE_EXPIRIES = Counter(
    "reprotrain_lease_expiries",
    "Runs put back in the queue because the worker holding them stopped sending heartbeats",
    registry=None,
)
LEASES_RETAKEN = Counter(
    "reprotrain_leases_retaken",
    "Requeued runs taken back, on the same attempt, by the worker whose lease had lapsed",
    registry=None,
)
HTTP_SECONDS = Histogram(
    "reprotrain_http_request_duration_seconds",
    "Time from a request to its response headers, by method, route template and status",
    ["method", "route", "status"],
    registry=None,
)
_UNMATCHED = "<unmatched>"  # a path no route has: never the raw path (unbounded labels)
# Every label comes from a closed set, whatever the client sends: a method is any token
# HTTP allows, so one outside these is "other" (a series per method would grow unbounded).
_METHODS = frozenset(
    ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "TRACE", "CONNECT")
)
_OTHER_METHOD = "other"
_STATUSES = frozenset(str(s.value) for s in HTTPStatus)


class _DatabaseCollector(Collector):
    """Gauges and counters read from the database at scrape time."""

    def __init__(self, maker: sessionmaker[Session], settings: Settings) -> None:
        self._maker, self._settings = maker, settings

    def collect(self) -> Iterator[Metric]:
        with self._maker() as db:
            by_status: dict[str, int] = {
                status: count
                for status, count in db.execute(
                    select(Run.status, func.count(Run.id)).group_by(Run.status)
                ).all()
            }
            verdicts: dict[str, int] = {
                verdict: count
                for verdict, count in db.execute(
                    select(Verdict.verdict, func.count(Verdict.id)).group_by(Verdict.verdict)
                ).all()
            }
            spot_checks: dict[str, int] = {
                status: count
                for status, count in db.execute(
                    select(SpotCheck.status, func.count(SpotCheck.id)).group_by(SpotCheck.status)
                ).all()
            }
            live_since = utcnow() - timedelta(seconds=self._settings.lease_seconds)
            live = db.scalar(select(func.count(Worker.id)).where(Worker.last_seen_at >= live_since))
        runs = GaugeMetricFamily(
            "reprotrain_runs", "Runs waiting or in progress, by status", labels=["status"]
        )
        for status in ("queued", "running"):
            runs.add_metric([status], by_status.get(status, 0))
        yield runs
        finished = CounterMetricFamily(
            "reprotrain_runs_finished", "Runs that reached an end, by outcome", labels=["outcome"]
        )
        for status in sorted(TERMINAL_STATUSES):
            finished.add_metric([status], by_status.get(status, 0))
        yield finished
        kinds = CounterMetricFamily(
            "reprotrain_verdicts",
            "Verdicts of reruns against their reference, by kind",
            labels=["verdict"],
        )
        for kind in ("identical", "diverged", "incomparable"):
            kinds.add_metric([kind], verdicts.get(kind, 0))
        yield kinds
        checked = CounterMetricFamily(
            "reprotrain_spot_checks",
            "Spot checks by outcome (pending: replays not all ended)",
            labels=["outcome"],
        )
        for outcome in ("pending", *SPOT_CHECK_OUTCOMES):
            checked.add_metric([outcome], spot_checks.get(outcome, 0))
        yield checked
        yield GaugeMetricFamily(
            "reprotrain_workers_live",
            "Workers seen (claim or heartbeat) within one lease period",
            value=live or 0,
        )
        yield from claimable_families(maker=self._maker, settings=self._settings)


OTHER_IMAGE = "<other>"  # images past REPRO_METRICS_MAX_IMAGE_LABELS, summed


def _capped(counts: dict[tuple[str, ...], int], limit: int) -> dict[tuple[str, ...], int]:
    """The counts with the image (the first label) kept for the `limit` images with the most
    runs and replaced by OTHER_IMAGE for the rest, so series stay bounded."""
    per_image: dict[str, int] = {}
    for labels, count in counts.items():
        per_image[labels[0]] = per_image.get(labels[0], 0) + count
    kept = set(sorted(per_image, key=lambda image: (-per_image[image], image))[:limit])
    out: dict[tuple[str, ...], int] = {}
    for (image, *rest), count in counts.items():
        key = (image if image in kept else OTHER_IMAGE, *rest)
        out[key] = out.get(key, 0) + count
    return out


def claimable_families(*, maker: sessionmaker[Session], settings: Settings) -> Iterator[Metric]:
    """The queue by what a worker must offer to claim a run, and running runs by what their
    worker offers: one autoscaler trigger per pool selects exactly what that pool can take."""
    with maker() as db:
        queued_rows = db.execute(
            select(
                Run.required_image,
                Run.replicas,
                Run.needs_code,
                Run.required_hardware,
                func.sum(Run.hosts),  # a multi-host run needs that many workers at once
            )
            .where(Run.status == "queued")
            .group_by(Run.required_image, Run.replicas, Run.needs_code, Run.required_hardware)
        ).all()
        per_worker = dict(
            db.execute(
                select(Run.worker_id, func.count(Run.id))
                .where(Run.status == "running", Run.worker_id.is_not(None))
                .group_by(Run.worker_id)
            ).all()
        )
        # A gang's other members are busy too (rank 0 holds the run).
        for worker_id in db.scalars(
            select(GangMember.worker_id).where(GangMember.rank > 0, GangMember.done_at.is_(None))
        ):
            per_worker[worker_id] = per_worker.get(worker_id, 0) + 1
        # JSON columns cannot be grouped by on PostgreSQL: the holders are read on their own.
        held_rows = [
            (images, devices, pool, per_worker[worker_id])
            for worker_id, images, devices, pool in db.execute(
                select(Worker.id, Worker.images, Worker.devices, Worker.pool).where(
                    Worker.id.in_(list(per_worker))
                )
            ).all()
        ]
    queued: dict[tuple[str, ...], int] = {}
    for image, replicas, needs_code, needs_hardware, count in queued_rows:
        code = "true" if needs_code else "false"
        key = (image or "", str(replicas), code, needs_hardware or "")
        queued[key] = queued.get(key, 0) + count
    held: dict[tuple[str, ...], int] = {}
    for images, devices, pool, count in held_rows:
        for image in dict.fromkeys(images or [""]):  # under each name its worker answers to
            by_image = (str(image), str(devices), pool or "")
            held[by_image] = held.get(by_image, 0) + count
    limit = settings.metrics_max_image_labels
    queued_family = GaugeMetricFamily(
        "reprotrain_queued_runs",
        "Workers queued runs need (one a run, a multi-host run's hosts), by the image they "
        "are pinned to (empty: any), the devices (replicas) they need, whether they run a "
        "code bundle and the hardware class they require (empty: any; a class matches a "
        "requirement it begins with)",
        labels=["image", "replicas", "code", "hardware"],
    )
    for labels, count in sorted(_capped(queued, limit).items()):
        queued_family.add_metric(list(labels), count)
    yield queued_family
    held_family = GaugeMetricFamily(
        "reprotrain_held_runs",
        "Busy workers (holding a run, or a member of a multi-host run's gang) by each image "
        "they advertise, the devices they offer and their pool (REPRO_WORKER_POOL; empty: "
        "none)",
        labels=["image", "devices", "pool"],
    )
    for labels, count in sorted(_capped(held, limit).items()):
        held_family.add_metric(list(labels), count)
    yield held_family


class _WaitingCollector(Collector):
    """How many requests wait on this process now (they hold no thread or connection)."""

    def __init__(self, state: Any) -> None:
        self._state = state

    def collect(self) -> Iterator[Metric]:
        watcher = getattr(self._state, "run_watcher", None)
        waits = getattr(self._state, "claim_waits", None)
        yield GaugeMetricFamily(
            "reprotrain_event_streams_open",
            "Run event streams open on this process",
            value=watcher.open_streams if watcher is not None else 0,
        )
        yield GaugeMetricFamily(
            "reprotrain_claims_waiting",
            "Long-poll claims waiting on this process",
            value=waits.waiting if waits is not None else 0,
        )


def make_registry(*, maker: sessionmaker[Session], settings: Settings, state: Any) -> Any:
    """The registry one app's `/metrics` exposes."""
    registry = CollectorRegistry()
    for metric in (CLAIM_SECONDS, LEASE_EXPIRIES, LEASES_RETAKEN, HTTP_SECONDS):
        registry.register(metric)
    registry.register(_DatabaseCollector(maker, settings))
    registry.register(_WaitingCollector(state))
    ProcessCollector(registry=registry)  # resident memory, CPU, open files
    return registry


def _template(scope: Scope) -> str:
    """The matched route's path template with the prefixes of the routers it is included in:
    a route of a router included under `/api/v1` knows only its own part."""
    route = scope.get("route")
    own = getattr(route, "path", None)
    if not isinstance(own, str) or not own:
        return _UNMATCHED
    if isinstance(route, Mount):
        return own + "/{path}"
    segments = scope["path"].split("/")
    prefix = "/".join(segments[: max(len(segments) - own.count("/"), 0)])
    return prefix + own


def request_labels(scope: Scope, status: int) -> tuple[str, str, str]:
    """The method, route template and status a request is counted under, each from a closed
    set: unknown methods are "other", unknown paths one label, odd statuses their class."""
    method = scope["method"] if scope["method"] in _METHODS else _OTHER_METHOD
    code = str(status)
    return method, _template(scope), code if code in _STATUSES else f"{code[:1]}xx"


class RequestTimer:
    """ASGI middleware observing each HTTP request's duration under its route template."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()

        async def timed_send(message: Message) -> None:
            if message["type"] == "http.response.start":
                HTTP_SECONDS.labels(*request_labels(scope, message["status"])).observe(
                    time.perf_counter() - started
                )
            await send(message)

        await self.app(scope, receive, timed_send)


def observe_claim(started: float, *, claimed: bool) -> None:
    """Record a claim that began at `started` (perf_counter) and ends now."""
    CLAIM_SECONDS.labels("claimed" if claimed else "empty").observe(time.perf_counter() - started)
