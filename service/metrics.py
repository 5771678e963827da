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
from service.persistence.models import TERMINAL_STATUSES, Run, Verdict, Worker, utcnow

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
        yield GaugeMetricFamily(
            "reprotrain_workers_live",
            "Workers seen (claim or heartbeat) within one lease period",
            value=live or 0,
        )


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
    for metric in (CLAIM_SECONDS, LEASE_EXPIRIES, HTTP_SECONDS):
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
